"""The researcher's journey, rehearsed end to end on the local SLURM cluster: Table 1 and the ablations for the
paper's pair in one command (scripts/run_grid.py), the pair as the hub serves it, read offline by every job.

On the "login node" the hub on the loopback (tests/support/fake_hub.py) serves the pair in shape and PairRM under
their real repository ids, and scripts/prepare_models.py fetches them into a fresh $HF_HOME. Then, with the hub gone
and HF_HUB_OFFLINE=1, the one command runs for model_pair=llama_mistral on two examples per task, its jobs packed
one per multirun (--pack), and writes the tables and figures. Every Table 1 cell (both protocols) and every
ablation point must be there and scored, each run loading the commits the cache recorded; the table must hold the
paper's rows and every figure must be drawn from that folder. About 4 minutes on two cores.
"""

import csv
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from adafuse import model_config
from eval.grid import load_grid
from tests.support.fake_hub import serving
from tests.support.paper_hub import hub_repos
from tests.support.paper_pair import NAMES
from tests.support.paths import ROOT, SHARED_DATA

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TASKS = ["nq", "squad", "triviaqa", "gsm8k", "flores_en_de", "flores_de_en"]
MEMBERS = list(NAMES)  # llama31_8b_instruct, mistral7b_instruct_v03: the single models' rows
FIGURES = ["tau", "branches", "max_words", "fixed_words", "diversity", "words_per_round", "runtime"]


def table_rows() -> dict[str, list[str]]:
    """Each row Table 1 must hold, with its tasks: the grid's (conf/grid/paper.yaml) for this pair."""
    grid = load_grid("paper")
    named = {"llm_blender": " [method.ranker=nll]", "deepen": " [method.main=0]"}
    named_paper = {"llm_blender": ",method.ranker=pairrm", "deepen": ",method.main=sentencepiece"}
    rows = {name: TASKS for name in MEMBERS}
    rows |= {m + named.get(m, ""): TASKS for m in grid.table.methods if m != "single"}
    rows |= {f"{name} [protocol=paper]": TASKS for name in MEMBERS}
    rows |= {f"{m} [protocol=paper{named_paper.get(m, '')}]": TASKS for m in grid.paper.methods if m != "single"}
    for knob, values in grid.ablations.knobs.items():
        rows |= {
            f"adafuse [method.{knob}={str(v).capitalize() if isinstance(v, bool) else v}]": ["nq", "gsm8k"]
            for v in values
        }
    return rows


def test_table_1_and_the_ablations_run_in_one_command_for_the_paper_pair_offline_on_the_cluster(
    cluster, paper_pair_dir, tmp_path
):
    repos = hub_repos(tmp_path / "hub", paper_pair_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ADAFUSE_DATA"))}
    env |= {"HF_HOME": str(tmp_path / "hf"), "ADAFUSE_DATA_DIR": str(SHARED_DATA)}
    with serving(repos) as hub:
        command = [sys.executable, str(ROOT / "scripts" / "prepare_models.py"), "model_pair=llama_mistral"]
        command += ["protocol=paper", "method=llm_blender"]
        fetched = subprocess.run(command, env=env | {"HF_ENDPOINT": hub.url}, capture_output=True, text=True)
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        commits = {repo: hub.commit(repo) for repo in repos}

    command = [sys.executable, str(ROOT / "scripts" / "run_grid.py"), "model_pair=llama_mistral"]
    command += ["--launcher", "slurm_cpu", "--pack", "--limit", "2", "task.max_new_tokens=4", "wandb.mode=disabled"]
    offline = env | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=offline, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "120 runs: 0 finished, 120 to run" in done.stdout  # the plan, said before anything ran
    results = tmp_path / "results" / "grid_llama_mistral"

    with open(results / "table1.csv") as f:
        cells = {(line["row"], line["task"]): line for line in csv.DictReader(f) if line["kind"] != "gain"}
    expected = {(row, task) for row, tasks in table_rows().items() for task in tasks} | {("adafuse", "nq")}
    assert expected <= set(cells), sorted(expected - set(cells))
    assert all(int(cells[cell]["n"]) == 2 and cells[cell]["value"] != "" for cell in expected)
    paper = (results / "table1_paper.md").read_text()
    assert "| paper: AdaFuse (LLaMA+Mistral)" in paper and "| paper: UniTE" in paper

    for name in FIGURES:
        assert (results / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
    tau = pd.read_csv(results / "figures" / "tau.csv")
    assert {t: sorted(f["tau"]) for t, f in tau.groupby("task")} == {
        t: [0.1, 0.3, 0.5, 0.7, 0.9] for t in ("nq", "gsm8k")
    }
    assert len(pd.read_csv(results / "figures" / "diversity.csv")) == 4  # two tasks, both ways of branching

    served = [(model_config(n).path, commits[model_config(n).path]) for n in NAMES]
    for metrics in results.rglob("metrics.json"):
        models = json.loads(metrics.read_text())["source"]["models"]
        assert {(m["hub"], m["commit"]) for m in models} <= set(served), metrics
