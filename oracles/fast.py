"""The fast path as the oracles compare it against themselves: a decode through the method seam, run by the
engine loop with one example in flight (what `Ensemble.decode` does, from members rather than an ensemble)."""

from adafuse.engine.loop import drive
from adafuse.ensemble import resolve_method
from adafuse.methods.session import Request
from adafuse.trace import Generation


def decode(members, prompt: str, cfg, **request) -> Generation:
    """Decode `prompt` with the method whose knobs `cfg` is; `request` holds the Request's other fields (stop,
    max_new_tokens, trace)."""
    spec, cfg = resolve_method(cfg, {})
    return drive(spec.generate(members, Request(prompt, **request), cfg))
