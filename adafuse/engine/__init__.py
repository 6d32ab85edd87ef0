"""The engine: examples in flight stepped together (loop.py), each step scheduled (scheduler.py: which examples start,
which passes run) and executed (executor.py: the backend runs the passes, each example gets its results)."""
