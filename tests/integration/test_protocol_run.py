"""`python run.py protocol=paper` end to end on the bundled pair: its own run directory, the paper's prompt
file and examples, method=adafuse_code, and paper_* metrics that the predictions reproduce."""

import json
import subprocess
import sys

import pytest

from eval.metrics import METRICS
from eval.paper_metrics import authors_pred
from tests.conftest import ROOT, SHARED_DATA, THREADS

pytestmark = pytest.mark.slow


def test_run_py_protocol_paper_writes_its_own_run_with_the_papers_scores(tmp_path):
    command = [sys.executable, str(ROOT / "run.py"), "task=nq", "protocol=paper", "task.limit=2"]
    command += [f"results_dir={tmp_path}", f"data.dir={SHARED_DATA}", f"threads={THREADS}"]
    command += ["wandb.mode=disabled", "progress=false"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    run_dir = tmp_path / "nq" / "adafuse_code" / "tiny" / "protocol=paper"
    assert sorted(p.name for p in tmp_path.rglob("metrics.json")) == ["metrics.json"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["protocol"], metrics["variant"], metrics["n"]) == ("paper", "paper", 2)
    assert metrics["method"] == {"name": "adafuse_code", "tau": 0.7, "branches": 3, "span_length": 1, "max_rounds": 5}

    prompt_file = (SHARED_DATA / "adafuse_local_datasets/NaturalQuestions/dev/nq_prompt.txt").read_text()
    questions = [
        json.loads(line)["question"]
        for line in (SHARED_DATA / "adafuse_local_datasets/NaturalQuestions/test/natural-questions.jsonl")
        .read_text()
        .splitlines()[:2]
    ]
    records = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    records.sort(key=lambda r: metrics["ids"].index(r["id"]))
    assert [r["prompt"] for r in records] == [f"{prompt_file}\n\nQuestion: {q}\nAnswer:" for q in questions]
    for r in records:
        assert authors_pred(r["prediction"]) == r["stats"]["notes"]["authors_pred"]

    # paper_em recomputed from the predictions alone, by the registered replica of the authors' scorer
    recomputed = METRICS["paper_em_nq"].corpus([r["prediction"] for r in records], [r["references"] for r in records])
    assert recomputed == pytest.approx(metrics["metrics"]["paper_em"])
    per_example = [METRICS["paper_em_nq"].per_example(r["prediction"], r["references"]) for r in records]
    assert per_example == [r["scores"]["paper_em"] for r in records]
    assert {"em", "f1", "paper_em"} <= set(metrics["metrics"])
