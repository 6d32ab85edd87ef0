"""What one forward pass needs from the layers the backend changed, set in one place (vLLM's forward context).

A backend changes a model in a few places (adafuse/backend/install.py): its layers run as the pass asks, attention
per request in a packed pass (adafuse/backend/attention.py), only the positions a pass reads
(adafuse/backend/live.py). None of those layers keeps state of its own between passes: each reads the
`ForwardContext` of the pass it runs in, which the backend sets around the model call (`forward_context`) and
nowhere else. What every backend's passes share is a field here (`live`, `split`); what one backend's layers read
is that backend's own (`own`: the CPU's `CpuPass`, adafuse/backend/cpu/tiles.py; the CUDA backend's `Ops`,
adafuse/backend/cuda/choice.py), which no other part reads.

The context is per thread (a `ContextVar`): on the CPU two models' passes run at once on threads of their own,
each in its own context. Outside any pass (transformers' `generate()` over a member's model, the oracles'
passes), layers see `OUTSIDE` (`own` None), and each backend's layers then compute every position as the engine's
pass alone does.
"""

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ForwardContext:
    live: Any = None  # adafuse.backend.live.LivePositions: the positions whose rows are multiplied, and logits made
    split: Any = None  # adafuse.backend.attention.SplitPass: a packed pass whose attention runs per request
    own: Any = None  # the backend's own settings for this pass, which its layers read (module docstring)


OUTSIDE = ForwardContext()
_CURRENT: contextvars.ContextVar[ForwardContext] = contextvars.ContextVar("adafuse_forward_context", default=OUTSIDE)


def current() -> ForwardContext:
    """The context of the pass running on this thread (`OUTSIDE` when none is)."""
    return _CURRENT.get()


@contextlib.contextmanager
def forward_context(context: ForwardContext):
    """Run a pass in `context` (the backend's one place to set it)."""
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)
