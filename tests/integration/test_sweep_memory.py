"""A sweep in one process holds one pair: a model its runs drop is freed before the next loads.

Measured as a user would see it: `run.py -m` with Hydra's basic launcher (every run in one process), in a child
process whose own peak resident memory is read at its exit. A greedy run of SmolLM2 at three dtypes loads three
models; the same at two slice sizes loads six (the second slice grows each run in place, after the other dtypes
were loaded in between). If dropped models were kept, the six-load sweep would peak about the three models'
size (1.1 GB) above the three-load one.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT, SHARED_DATA

pytestmark = pytest.mark.slow

# The peak resident memory of `python run.py ...`, run by a process that runs nothing else and reads its one child's
# peak (RUSAGE_CHILDREN), printed in bytes.
PEAK_OF_RUN = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, *sys.argv[1:]])
print("peak_rss_bytes", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, flush=True)
sys.exit(done.returncode)
"""
DTYPES = "model_pair.members.m0.dtype=float32,bfloat16,float16"
TOLERANCE = 0.2e9  # what decoding a second example and Python's own growth may add


def sweep_peak(out: Path, limits: str) -> int:
    command = [
        *(sys.executable, "-c", PEAK_OF_RUN, str(ROOT / "run.py"), "-m", "method=single", f"task.limit={limits}"),
        *(DTYPES, "task.max_new_tokens=4", f"data.dir={SHARED_DATA}", f"results_dir={out / 'results'}"),
        *("wandb.mode=disabled", "progress=false", f"hydra.sweep.dir={out / 'multirun'}"),
    ]
    done = subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    for dtype in ("float32", "bfloat16", "float16"):
        run = out / "results" / "nq" / "single" / "tiny" / f"model_pair.members.m0.dtype={dtype},task.max_new_tokens=4"
        assert json.loads((run / "metrics.json").read_text())["n"] == max(map(int, limits.split(",")))
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("peak_rss_bytes")]
    return int(line.split()[1])


def test_a_sweep_of_six_loads_peaks_where_one_of_three_does(tmp_path):
    (tmp_path / "three").mkdir()
    (tmp_path / "six").mkdir()
    three = sweep_peak(tmp_path / "three", "1")
    six = sweep_peak(tmp_path / "six", "1,2")
    assert six - three < TOLERANCE, f"6 loads peaked at {six / 1e9:.2f} GB, 3 loads at {three / 1e9:.2f} GB"
