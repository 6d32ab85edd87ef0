"""Maintainer tooling, kept in the repository and out of the installed package: recording and checking the authors'
fixtures, the paper-shaped pair, speed measurements, the GPU check, the docs' tables and figure, and the bad inputs
the docs list. What the tests share lives in tests/support/. Run a tool as `python -m tools.<name>` from the
repository root; tests/README.md says which tests run each."""
