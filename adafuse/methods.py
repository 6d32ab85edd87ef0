"""The decoding methods by name: the dataclass of its knobs, `generate(members, prompt, cfg, *, stop,
max_new_tokens, trace) -> Generation`, and `positions_needed(cfg, max_new_tokens)`, the context it may
use after the prompt. Baselines register here too (baselines/)."""

from collections.abc import Callable
from dataclasses import dataclass

from adafuse import decode, greedy
from adafuse.config import AdaFuseConfig, SingleConfig
from adafuse.registry import Registry


@dataclass(frozen=True)
class Method:
    config: type
    generate: Callable
    positions_needed: Callable[[object, int], int]


METHODS = Registry("method")
METHODS.register("adafuse")(Method(AdaFuseConfig, decode.generate, decode.positions_needed))
METHODS.register("single")(Method(SingleConfig, greedy.generate, greedy.positions_needed))
