"""What is alive when a run starts kept out of the cyclic garbage collector's scans while the run goes on.

A run's steps make and drop many small objects (tensors, a pass's plans, a cache's layers), so the collector runs
often, and now and then it scans every object in the process: the models' modules and parameters, the tokenizers,
transformers' and torch's own (some 450 thousand with the paper pair in shape, a quarter of a second a scan on this
project's CPU: tools/bench_host.py), time a GPU waits on. Those objects outlive the run, so the run freezes them at
its start (`gc.freeze`: the collector skips them; they are still freed when their count of references drops) and
unfreezes them at its end, where a cycle among them that the run let go is collected again. What the run makes is
collected as ever, a step's garbage or a round's. As vLLM's engine freezes what its start-up made. Runs that overlap
(two streams read in turn, a run driven inside another's step) share one freeze, released when the last ends.

A run ends when its stream is read to the end, fails, is closed, or is let go: a stream let go while it is itself in
a reference cycle is only closed by the collector, which it keeps from running over the frozen objects; close such a
stream (`for ... in stream` does, as does `break` out of it, or `stream.close()`).
"""

import gc
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_runs = 0  # runs in progress in this process: the collector's frozen set is the process's, not a run's


@contextmanager
def frozen_while_running():
    global _runs
    with _lock:
        if _runs == 0:
            gc.freeze()
        _runs += 1
    try:
        yield
    finally:
        with _lock:
            _runs -= 1
            if _runs == 0:
                gc.unfreeze()
