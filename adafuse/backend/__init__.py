"""The backend seam: how a step's forward passes are computed on a device, behind one interface.

The engine (adafuse/engine/) plans a step's passes as data, `Pass`es of `Read`s, and hands them to the backend
of their models' device type (`backend_for`); the backend returns each read's result. Everything the engine
changes in torch and transformers lives behind this seam: each backend prepares a model once (`prepare`:
row-tiled linear layers, the attention wrapper for packed passes, the CPU's blocked head), owns the probes of
its kernels and their store, says how much memory a step may take (`memory_budget`) and times its passes.
A forward pass's layers read what they need from one forward context, set by the backend around the model
call (adafuse/backend/forward.py). Nothing outside this package imports its modules but this one.

A pass is of one of four kinds (adafuse/backend/interface.py): PREFIX, a prompt's shared prefix; PROMPT, a prompt read
from nothing; ALONE, one read to weights whose attention cannot be split; MERGED, one or more reads to the same weights
in one packed pass, each computed exactly as alone (adafuse/backend/split_pass.py).

Backends are found by device type through the packaging entry-point group `adafuse.backends` (pyproject.toml), as
methods are: `cpu` (adafuse/backend/cpu/: row tiles, per-request attention, what pays on a CPU), `cuda`
(adafuse/backend/cuda/: each layer in one call, with batch-invariant kernels of its own where the GPU's do not keep
a row's bits, and said so where neither does), and `exact` for any other device type (adafuse/backend/cpu/exact.py:
row tiles and per-request attention, one pass after another). A package of your own can add one; each backend is
a folder of its own and owns its part of a pass's forward context (adafuse/backend/forward.py `own`).
"""

import threading

import torch

from adafuse.backend.interface import ALONE, MERGED, PREFIX, PROMPT, Backend, Execution, Pass, Prepared, Ran, Read
from adafuse.backend.transformers_check import MIN_TRANSFORMERS, check_model, check_transformers
from adafuse.registry import Registry

__all__ = [
    "ALONE",
    "BACKENDS",
    "MERGED",
    "MIN_TRANSFORMERS",
    "PREFIX",
    "PROMPT",
    "Backend",
    "Execution",
    "Pass",
    "Prepared",
    "Ran",
    "Read",
    "backend_for",
    "check_model",
    "check_transformers",
]

# device type -> a backend class, made as `cls(device_type)`; "exact" serves a device type with none of its own
BACKENDS = Registry("backend", entry_points="adafuse.backends")
FALLBACK = "exact"

_MADE: dict[str, Backend] = {}
_MADE_LOCK = threading.Lock()


def backend_for(device: torch.device | str) -> Backend:
    """This process's backend for the device's type (`BACKENDS`), made on first use."""
    kind = torch.device(device).type
    with _MADE_LOCK:
        if kind not in _MADE:
            _MADE[kind] = BACKENDS[kind if kind in BACKENDS else FALLBACK](kind)
        return _MADE[kind]
