"""Tests of Triton kernels on a CPU, under Triton's interpreter.

Triton reads TRITON_INTERPRET when it wraps a function, and its own library's functions are wrapped when triton is
first imported: by torch itself as soon as anything imports torch._dynamo, so in the suite's processes long before
a test file could set it. A file of such tests therefore marks them `@interpreted` (collected only in a process
started with TRITON_INTERPRET=1) and holds one `@compiled` test that runs the file again in such a process
(`run_interpreted`) and fails with its report.
"""

import os
import subprocess
import sys

from tests.support.paths import ROOT

INTERPRETED = os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "yes", "on"}
WORKER_VARIABLES = {"PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST"}  # the child is no worker


def interpreted(test):
    """Collected only in a process whose Triton interprets."""
    test.__test__ = INTERPRETED
    return test


def compiled(test):
    """Collected only in a process whose Triton compiles, as the suite's (the child runs the others)."""
    test.__test__ = not INTERPRETED
    return test


def run_interpreted(test_file: str, timeout: float) -> str:
    """Run `test_file` in one process with TRITON_INTERPRET=1; assert it passed; return the end of its report."""
    env = {name: value for name, value in os.environ.items() if name not in WORKER_VARIABLES}
    command = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "--durations=5", test_file]
    child = subprocess.run(
        command, cwd=ROOT, env=env | {"TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=timeout
    )
    report = child.stdout[-8000:] + child.stderr[-2000:]
    assert child.returncode == 0, report
    assert " passed" in report, report
    return report
