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

Backends (`backend_for`): `CpuExactBackend` (adafuse/backend/cpu/) on the CPU; `CudaBackend`
(adafuse/backend/cuda/) on a GPU: each layer in one call, with batch-invariant kernels of its own where the GPU's
do not keep a row's bits, and said so where neither does; `ExactBackend` (adafuse/backend/exact.py) elsewhere: the
CPU's row tiles and per-request attention, one pass after another.
"""

import threading

import torch

from adafuse.backend.cpu import CpuExactBackend
from adafuse.backend.exact import ExactBackend
from adafuse.backend.interface import ALONE, MERGED, PREFIX, PROMPT, Backend, Execution, Pass, Prepared, Ran, Read
from adafuse.backend.transformers_check import MIN_TRANSFORMERS, check_model, check_transformers

__all__ = [
    "ALONE",
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

_BACKENDS: dict[str, Backend] = {}
_BACKENDS_LOCK = threading.Lock()


def backend_for(device: torch.device | str) -> Backend:
    """This process's backend for the device's type, made on first use."""
    key = torch.device(device).type
    with _BACKENDS_LOCK:
        if key not in _BACKENDS:
            if key == "cpu":
                _BACKENDS[key] = CpuExactBackend()
            elif key == "cuda":
                from adafuse.backend.cuda.backend import CudaBackend  # imports triton (through its kernels): late

                _BACKENDS[key] = CudaBackend()
            else:
                _BACKENDS[key] = ExactBackend(key)
        return _BACKENDS[key]
