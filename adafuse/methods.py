"""The decoding methods by name. Each is `generate(members, prompt, cfg, *, stop, max_new_tokens, trace)`
returning a `Generation`, plus the dataclass of its knobs. Baselines register here too (baselines/)."""

from collections.abc import Callable
from dataclasses import dataclass

from adafuse import decode, greedy
from adafuse.config import AdaFuseConfig, SingleConfig
from adafuse.registry import Registry


@dataclass(frozen=True)
class Method:
    config: type
    generate: Callable


METHODS = Registry("method")
METHODS.register("adafuse")(Method(AdaFuseConfig, decode.generate))
METHODS.register("single")(Method(SingleConfig, greedy.generate))
