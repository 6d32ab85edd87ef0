"""The CUDA backend's own kernels: fixed-order Triton kernels (linear, RMSNorm, log-softmax and attention over
requests packed end to end) whose every row, or every request, gets the same bits whatever else shares the
call, registered as torch ops `adafuse::*` for tracing and launched directly in eager mode (`kernels.py` says what
each one fixes and what is verified where),
and the backend that runs a model's passes with them where the GPU's own kernels do not keep a row's bits
(`backend.py`; `choice.py` probes which, `layers.py` and `attention.py` call them).

Importing this package needs neither a GPU nor triton, and imports neither torch nor triton; importing
`kernels.py` registers the ops, with triton where it is installed and without it where it is not. A caller learns
whether the kernels can run from `available()` before choosing them; where it is False (triton not installed),
calling an op raises a RuntimeError that says so (its fake kernels, for meta tensors, still work).
"""

import importlib.util


def available() -> bool:
    """Whether triton is installed, so that the `adafuse::*` ops can launch their kernels: on a CUDA tensor
    always, on a CPU tensor only under Triton's interpreter (TRITON_INTERPRET=1, for tests). Cheap: it looks
    the package up without importing it."""
    return importlib.util.find_spec("triton") is not None
