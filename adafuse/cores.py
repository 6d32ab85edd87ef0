"""Threads that run side by side share the CPU's cores in their matrix multiplies.

An example's members run their forward passes on threads of their own, side by side (batched:
`Scheduler.run_waiting`; unbatched: `side_by_side`). Left alone, each pass's multiplies ask MKL for
every core, so two passes at once run twice as many compute threads as there are cores, and each
thread spends much of its time waiting for a core the other holds. Inside `CoreShare.joined`, a thread's
multiplies use its share of the cores: the torch thread count divided by the threads of the share
still running, so one each while two run, and all of them for the last one left.

Only MKL's count changes, per thread (`MKL_Set_Num_Threads_Local`), and only where it keeps the bits:
adafuse/invariance.py runs a multiply with fewer threads only where a probe (once per kernel, row
count and thread count) shows that it gives the bits it gets with all of them. Attention and the other
OpenMP kernels keep their thread count: the one-query path of attention splits its work by threads,
and its bits change with them. Where MKL's per-thread count cannot be set (a build without MKL),
nothing changes.
"""

import contextlib
import ctypes
import threading
from pathlib import Path

import torch


def _mkl_local_threads():
    """MKL's `MKL_Set_Num_Threads_Local` (int -> the previous count; 0 means the process's count), or None.
    torch links MKL into libtorch_cpu, whose symbols Python loads privately: it is looked up there."""
    if not torch.backends.mkl.is_available():
        return None
    for library in sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*")):
        try:
            function = ctypes.CDLL(str(library)).MKL_Set_Num_Threads_Local
        except (OSError, AttributeError):
            continue
        function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
        return function
    return None


_SET_LOCAL = _mkl_local_threads()
_JOINED = threading.local()  # .share: the CoreShare the calling thread runs in, if any


class CoreShare:
    """`threads` threads that run side by side; each runs its part inside `joined()`."""

    def __init__(self, threads: int):
        self.running = threads
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def joined(self):
        """The calling thread's part: its multiplies use its share of the cores until it leaves."""
        outer = getattr(_JOINED, "share", None)
        _JOINED.share = self
        try:
            yield
        finally:
            _JOINED.share = outer
            with self.lock:
                self.running -= 1


def blas_threads() -> int | None:
    """The MKL threads of the calling thread's share of the cores now, or None: all of them (it shares
    nothing, the others of its share have ended, or MKL's count cannot be set per thread)."""
    share = getattr(_JOINED, "share", None)
    if share is None or _SET_LOCAL is None or share.running <= 1:
        return None
    return max(1, torch.get_num_threads() // share.running)


@contextlib.contextmanager
def mkl_threads(count: int | None):
    """MKL multiplies of the calling thread use `count` threads inside this block (None: as they would)."""
    if count is None or _SET_LOCAL is None:
        yield
        return
    previous = _SET_LOCAL(count)
    try:
        yield
    finally:
        _SET_LOCAL(previous)
