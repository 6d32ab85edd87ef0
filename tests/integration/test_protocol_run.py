"""`python run.py task=nq protocol=paper` end to end on the bundled pair, composed and run as run.py does
it, in the test process (which has the pair loaded): its own run directory, the paper's prompt file and
examples, method=adafuse_code, and paper_* metrics that the predictions reproduce."""

import json
from pathlib import Path

import pytest

from conf.compose import compose_run
from eval.metrics import METRICS
from eval.paper_metrics import authors_pred
from eval.runner import main
from tests.support.paths import SHARED_DATA

pytestmark = pytest.mark.slow


def test_run_py_protocol_paper_writes_its_own_run_with_the_papers_scores(tmp_path):
    overrides = ["task=nq", "protocol=paper", "task.limit=2", f"results_dir={tmp_path}", f"data.dir={SHARED_DATA}"]
    overrides += ["wandb.mode=disabled", "progress=false"]
    main(compose_run(*overrides), Path(compose_run(*overrides, hydra=True).hydra.run.dir))

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
