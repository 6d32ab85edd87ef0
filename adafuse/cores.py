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
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
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
# Seconds a thread that runs Python may keep the GIL while another waits for it (Python's default: 0.005)
HANDOFF_SECONDS = 0.001
_JOINED = threading.local()  # .share: the CoreShare the calling thread runs in, if any
_KEPT: dict[tuple[str, int], ThreadPoolExecutor] = {}  # (purpose, process id) -> its threads
_KEPT_LOCK = threading.Lock()


def kept_threads(purpose: str, workers: int) -> ThreadPoolExecutor:
    """This process's threads for `purpose`, made once and kept: each keeps its OpenMP team, which a new
    thread would start again. A forked child makes its own (its parent's threads are not in it)."""
    with _KEPT_LOCK:
        key = (purpose, os.getpid())
        if key not in _KEPT:
            for stale in [k for k in _KEPT if k[1] != key[1]]:
                del _KEPT[stale]
            _KEPT[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"adafuse-{purpose}")
        return _KEPT[key]


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


def can_share() -> bool:
    """Can a thread's MKL multiplies be limited to its share of the cores (MKL, and its per-thread count)?"""
    return _SET_LOCAL is not None


def free_cores() -> int:
    """The cores the calling thread may use now: its share's, or all of them (the torch thread count)."""
    return blas_threads() or torch.get_num_threads()


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


@contextlib.contextmanager
def quick_gil_handoff(seconds: float = HANDOFF_SECONDS):
    """Inside this block, a thread waiting for the GIL gets it after at most `seconds` (sys.setswitchinterval,
    never raised). Passes side by side alternate between Python (the GIL held) and kernels (the GIL free):
    with Python's 5 ms, a pass back from a multiply could wait that long while the other ran its Python.
    Outputs do not change: which thread runs when never changes what a pass computes."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
