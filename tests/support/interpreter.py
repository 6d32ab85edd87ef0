"""Tests of Triton kernels on a CPU, under Triton's interpreter.

Triton reads TRITON_INTERPRET when it wraps a function, and its own library's functions are wrapped when triton is
first imported: by torch itself as soon as anything imports torch._dynamo, so in the suite's processes long before
a test file could set it. A file of such tests therefore marks them `@interpreted` (collected only in a process
started with TRITON_INTERPRET=1) and holds one `@compiled` test that runs the file again in such a process
(`run_interpreted`) and fails with its report.

The host's BLAS is kept out of the verdicts. The kernels multiply by hand under the interpreter
(adafuse/backend/cuda/kernels.py `_dot`); were numpy's matmul to reach a result again, a row's bits would follow
which kernel OpenBLAS picked for the host's CPU: its Haswell and Zen kernels give a float32 row other bits at
another place of a tile, its SkylakeX and Sandybridge kernels do not (`matmul_moves_a_row`). So every child runs
with one of the former forced (`HOSTILE_BLAS`) wherever the CPU can run it, and
tests/unit/test_cuda_kernels.py runs its bit-for-bit tests again under other kernels and thread counts.
"""

import os
import platform
import subprocess
import sys
from pathlib import Path

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


def triton_at_least(release: str) -> bool:
    """Whether Triton `release` or newer is installed."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        return Version(version("triton")) >= Version(release)
    except PackageNotFoundError:
        return False


def interpreter_runs() -> bool:
    """Whether Triton 3.7 or newer is installed (pyproject's `interpreter` extra): the interpreters of 3.3 to 3.6
    fail under numpy 2.4, and CUDA builds of torch before 2.12 pin one of them."""
    return triton_at_least("3.7")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux), empty elsewhere."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return set()
    line = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def openblas_kernels() -> list[str]:
    """The OpenBLAS kernels (OPENBLAS_CORETYPE, read by numpy's DYNAMIC_ARCH OpenBLAS) this CPU can run."""
    if platform.machine() not in {"x86_64", "AMD64"}:
        return []
    flags = cpu_flags()
    kernels = ["Sandybridge"] if "avx" in flags else []
    kernels += ["Haswell", "Zen"] if {"avx2", "fma"} <= flags else []
    kernels += ["SkylakeX"] if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags else []
    return kernels


# The child's BLAS where the CPU can run it: a kernel under which numpy's float32 matmul moves a row's bits with
# its place in a tile (`matmul_moves_a_row`), so that a verdict that still hung on the host's BLAS would fail on
# every such host, not only on some.
HOSTILE_BLAS = {"OPENBLAS_CORETYPE": "Haswell"} if "Haswell" in openblas_kernels() else {}

MATMUL_MOVES_A_ROW = """
import numpy as np
rng = np.random.default_rng(0)
tile, weight = rng.standard_normal((2, 64, 64)).astype(np.float32)
alone = np.zeros_like(tile)
alone[0] = tile[6]
print(int((np.matmul(alone, weight)[0].view(np.int32) != np.matmul(tile, weight)[6].view(np.int32)).sum()))
"""


def child_env(blas: dict[str, str]) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in WORKER_VARIABLES}
    return env | blas | {"TRITON_INTERPRET": "1"}


def matmul_moves_a_row(blas: dict[str, str]) -> bool:
    """Whether numpy's float32 matmul, under these BLAS settings, gives row 6 of a 64-row tile other bits than the
    same row at place 0: what the interpreter's tl.dot would hand a kernel."""
    child = subprocess.run(
        [sys.executable, "-c", MATMUL_MOVES_A_ROW], env=child_env(blas), capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr
    return int(child.stdout) > 0


def run_interpreted(test_file: str, timeout: float, blas: dict[str, str] | None = None, select: str = "") -> str:
    """Run `test_file` (its tests matching `select`, a -k expression, where given) in one process with
    TRITON_INTERPRET=1 and the BLAS settings `blas` (default `HOSTILE_BLAS`); assert it passed; return the end of
    its report."""
    command = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "--durations=5", test_file]
    command += ["-k", select] if select else []
    env = child_env(HOSTILE_BLAS if blas is None else blas)
    child = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    report = child.stdout[-8000:] + child.stderr[-2000:]
    assert child.returncode == 0, report
    assert " passed" in report, report
    return report
