"""What one forward pass needs from the layers the backend changed, set in one place (vLLM's forward context).

A backend changes a model in a few places (adafuse/backend/tiles.py: linear layers in row tiles;
adafuse/backend/attention.py: attention per request in a packed pass; adafuse/backend/live.py: only the
positions a pass reads; adafuse/backend/cpu/: the cores a thread may use). None of those layers keeps state of
its own between passes: each reads the `ForwardContext` of the pass it runs in, which the backend sets around
the model call (`forward_context`) and nowhere else.

The context is per thread (a `ContextVar`): on the CPU two models' passes run at once on threads of their own,
each in its own context. Outside any pass (transformers' `generate()` over a member's model, the oracles'
passes), layers see `OUTSIDE`: row tiles on, everything else off, so such a pass computes every position as
the engine's pass alone does.
"""

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ForwardContext:
    tiles: bool = True  # linear layers multiply in row tiles (batch-invariant); False: the stock kernels, one call
    live: Any = None  # adafuse.backend.live.LivePositions: the positions whose rows are multiplied, and logits made
    split: Any = None  # adafuse.backend.attention.SplitPass: a packed pass whose attention runs per request
    share: Any = None  # adafuse.backend.cpu.cores.CoreShare: the threads this thread shares the cores with
    ops: Any = None  # adafuse.backend.cuda.choice.Ops: which kernels the CUDA backend's layers use in this pass


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
