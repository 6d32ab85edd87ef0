"""docs/your_own.md's worked examples, each command run as the page writes it: a pair of two local models, a task
from a JSONL file with its metrics, and a grid for that task, from files in a folder of your own
(docs/examples/conf, through hydra.searchpath). They run in a folder beside the checkout that links its files,
so that what they write (models/, results/) stays out of it."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.support.docs import blocks
from tests.support.paths import ROOT, SHARED_DATA

pytestmark = pytest.mark.slow

PAGE = ROOT / "docs" / "your_own.md"


def commands() -> list[str]:
    lines = [line for _, body in blocks(PAGE, "check: compose") for line in body.splitlines()]
    return [line.split("  #")[0].strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_pages_commands_run_as_written_and_do_what_it_says(tmp_path):
    for name in ("run.py", "conf", "scripts", "docs", "tools"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {"ADAFUSE_DATA_DIR": str(SHARED_DATA), "WANDB_MODE": "disabled"}
    for command in commands():
        words = shlex.split(command)
        assert words[0] == "python", command
        done = subprocess.run(
            [sys.executable, *words[1:]],
            cwd=tmp_path,
            env=os.environ | env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"

    pair = json.loads((tmp_path / "results/nq/adafuse/my_pair/task.max_new_tokens=8/metrics.json").read_text())
    assert pair["models"] == ["my_llama", "my_mistral"] and pair["n"] == 2
    capitals = json.loads((tmp_path / "results/capitals/adafuse/tiny/default/metrics.json").read_text())
    assert capitals["n"] == 4 and set(capitals["metrics"]) == {"em", "f1"}
    table = (tmp_path / "results" / "table1.md").read_text()
    assert "| capitals (n=4, canonical)" in table.replace("  ", " ")
    grid = tmp_path / "results" / "grid_tiny"
    for row in (
        "smollm2_135m",
        "gemma3_270m",
        "adafuse",
        "unite",
        "adafuse [method.tau=0.3]",
        "adafuse [method.tau=0.9]",
    ):
        assert f"| {row} " in (grid / "table1.md").read_text(), row
    assert (grid / "figures" / "tau.png").is_file()
