"""The ensemble as a service: an OpenAI-compatible HTTP server over the engine loop (docs/serve.md).

A layer above the engine, beside eval/: it reaches the engine only through its public API (`adafuse`, as
tests/unit/test_layers.py holds), and reads the model pairs as the runner does (eval/runner.py).
`serve/protocol.py` checks request bodies, `serve/loop.py` is the engine's one thread, `serve/app.py` the
routes and the `adafuse-serve` command.
"""
