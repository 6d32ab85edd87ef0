"""What is alive when an engine step starts kept out of the cyclic garbage collector's scans during the step.

A step makes and drops many small objects (tensors, a pass's plans, a cache's layers), so the collector runs
often, and now and then it scans every object in the process: the models' modules and parameters, the tokenizers,
transformers' and torch's own (some 450 thousand with the paper pair in shape, a quarter of a second each time on
this project's CPU: tools/bench_host.py), time a GPU waits on. So each step freezes what is alive at its start
(`gc.freeze`: the collector skips it; it is still freed when its count of references drops), and unfreezes it at its
end, where a cycle the step let go is collected again; within the step a scan sees the step's own objects alone.
vLLM's engine freezes what its start-up made, for good; a step at a time, nothing stays frozen after a run, however
it ended or was left. Freezing and unfreezing splice the collector's lists: no object is visited. Steps that
overlap (a run driven inside a step, engines on two threads) share one freeze, released when the last ends.
"""

import gc
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_steps = 0  # steps in progress in this process: the collector's frozen set is the process's, not a step's


@contextmanager
def frozen_heap():
    global _steps
    with _lock:
        if _steps == 0:
            gc.freeze()
        _steps += 1
    try:
        yield
    finally:
        with _lock:
            _steps -= 1
            if _steps == 0:
                gc.unfreeze()
