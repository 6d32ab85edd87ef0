"""The CPU's cores, shared by threads that multiply side by side (adafuse/backend/cpu/__init__.py).

On the CPU the backend runs different models' passes of one step on threads of their own, side by side, and
the blocked vocabulary projection lets a kept thread take blocks while a core is free
(adafuse/backend/cpu/projection.py). Left alone, each pass's multiplies ask MKL for every core, so two passes
at once run twice as many compute threads as there are cores, and each thread spends much of its time waiting
for a core the other holds. A thread that runs its passes in a `CoreShare` (the forward context's `share`,
adafuse/backend/forward.py) multiplies on its share of the cores: the torch thread count divided by the
threads of the share still running, so one each while two run, and all of them for the last one left.

Only MKL's count changes, per thread (`MKL_Set_Num_Threads_Local`), and only where it keeps the bits:
adafuse/backend/cpu/tiles.py runs a multiply with fewer threads only where a probe (once per kernel, row count and
thread count) shows that it gives the bits it gets with all of them. Attention and the other OpenMP kernels
keep their thread count: the one-query path of attention splits its work by threads, and its bits change
with them. Where MKL's per-thread count cannot be set (a build without MKL), nothing changes.
"""

import contextlib
import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch


class CoreShare:
    """`threads` threads that run side by side, each in a forward context that names this share; each calls
    `leave` when its part is done, and the ones still running get its cores."""

    def __init__(self, threads: int):
        self.running = threads
        self.lock = threading.Lock()

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


class Cores:
    """MKL's per-thread thread count (None where this torch build has none), and this process's kept threads."""

    def __init__(self, set_local):
        self._set_local = set_local  # MKL_Set_Num_Threads_Local: int -> the previous count (0: the process's)
        self._kept: dict[tuple[str, int], ThreadPoolExecutor] = {}  # (purpose, process id) -> its threads
        self._kept_lock = threading.Lock()

    @classmethod
    def of_this_torch(cls) -> "Cores":
        """MKL's `MKL_Set_Num_Threads_Local`, looked up in libtorch_cpu: torch links MKL into it, and Python
        loads its symbols privately, so it is not found by name in the process."""
        if not torch.backends.mkl.is_available():
            return cls(None)
        for library in sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*")):
            try:
                function = ctypes.CDLL(str(library)).MKL_Set_Num_Threads_Local
            except (OSError, AttributeError):
                continue
            function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
            return cls(function)
        return cls(None)

    @property
    def can_share(self) -> bool:
        """Can a thread's MKL multiplies be limited to its share of the cores?"""
        return self._set_local is not None

    def blas_threads(self, share: CoreShare | None) -> int | None:
        """The MKL threads of a thread's part of `share` now, or None: all of them (it shares nothing, the
        others of its share have ended, or MKL's count cannot be set per thread)."""
        if share is None or self._set_local is None or share.running <= 1:
            return None
        return max(1, torch.get_num_threads() // share.running)

    def free_cores(self, share: CoreShare | None) -> int:
        """The cores a thread of `share` may use now: its part's, or all of them (the torch thread count)."""
        return self.blas_threads(share) or torch.get_num_threads()

    @contextlib.contextmanager
    def mkl_threads(self, count: int | None):
        """MKL multiplies of the calling thread use `count` threads inside this block (None: as they would)."""
        if count is None or self._set_local is None:
            yield
            return
        previous = self._set_local(count)
        try:
            yield
        finally:
            self._set_local(previous)

    def kept_threads(self, purpose: str, workers: int) -> ThreadPoolExecutor:
        """This process's threads for `purpose`, made once and kept: each keeps its OpenMP team, which a new
        thread would start again. A forked child makes its own (its parent's threads are not in it)."""
        with self._kept_lock:
            key = (purpose, os.getpid())
            if key not in self._kept:
                for stale in [k for k in self._kept if k[1] != key[1]]:
                    del self._kept[stale]
                self._kept[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"adafuse-{purpose}")
            return self._kept[key]
