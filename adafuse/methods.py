"""The decoding methods by name.

A method is a plain function written once per example,
`generate(members, prompt, cfg, *, stop, max_new_tokens, trace) -> Generation`, with the dataclass of
its knobs, `positions_needed(cfg, max_new_tokens)` (the context it may use after the prompt) and
`members_used(cfg, k)` (which of the pair's k models it decodes with; the runner loads only those and
passes None for the others). AdaFuse and `single` live in
adafuse/; the baselines in baselines/, which registers them when imported below.
"""

from collections.abc import Callable
from dataclasses import dataclass

from adafuse import decode, greedy
from adafuse.config import AdaFuseConfig, SingleConfig
from adafuse.registry import Registry


def every_member(cfg, available: int) -> list[int]:
    return list(range(available))


@dataclass(frozen=True)
class Method:
    config: type
    generate: Callable
    positions_needed: Callable[[object, int], int]
    members_used: Callable[[object, int], list[int]] = every_member


METHODS = Registry("method")
METHODS.register("adafuse")(Method(AdaFuseConfig, decode.generate, decode.positions_needed))
METHODS.register("single")(Method(SingleConfig, greedy.generate, greedy.positions_needed, greedy.members_used))

import baselines  # noqa: E402, F401  (each baseline module registers itself in METHODS)
