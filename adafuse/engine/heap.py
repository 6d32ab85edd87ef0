"""What is alive when an engine starts on its work kept out of the cyclic garbage collector's scans until the work
is done.

An engine's steps make and drop many small objects (tensors, a pass's plans, a cache's layers), so the collector
runs often, and now and then it scans every object in the process: the models' modules and parameters, the
tokenizers, transformers' and torch's own (some 450 thousand with the paper pair in shape, a quarter of a second a
scan on this project's CPU: tools/bench_host.py), time a GPU waits on. Those objects outlive the work, so an engine
(adafuse/engine/loop.py) freezes them at its first step with work (`hold`; `gc.freeze`: the collector skips them,
and they are still freed when their count of references drops) and unfreezes them once nothing is left in flight
or queued, or it is closed (`release`), where a cycle among them that the work let go is collected again. What the
work makes is collected as ever, a step's garbage or a round's. As vLLM's engine freezes what its start-up made.
Engines at work at once (two streams read in turn, a run driven inside another's step, the server's) share one
freeze, released when the last is done.

A stream let go unfinished is closed when its count of references drops, and its engine with it; one let go while
it is in a reference cycle is closed only by the collector, which it keeps from running over the frozen objects:
close such a stream (`for ... in stream` does, as does `break` out of it, or `stream.close()`).
"""

import gc
import threading

_lock = threading.Lock()
_held = 0  # engines at work in this process: the collector's frozen set is the process's, not an engine's


def hold() -> None:
    """An engine starts on its work: the first of those at work freezes what is alive."""
    global _held
    with _lock:
        if _held == 0:
            gc.freeze()
        _held += 1


def release() -> None:
    """An engine `hold` counted is done: the last of those at work unfreezes."""
    global _held
    with _lock:
        _held -= 1
        if _held == 0:
            gc.unfreeze()
