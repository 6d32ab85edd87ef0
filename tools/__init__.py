"""Maintainer tooling, kept in the repository and out of the installed package: recording and checking
the authors' fixtures, the paper-shaped test pair, speed and device measurements, and what the tests
share (paths, member stand-ins, running a script in process). Run a tool as `python -m tools.<name>`
from the repository root."""
