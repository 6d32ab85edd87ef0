"""method=adafuse_code through the harness: results written and scored, their pred and stop recorded,
the trace serialisable."""

import json

import pytest

from conf.compose import compose_run
from eval.paper_metrics import authors_pred
from eval.runner import main
from tests.support.paths import SHARED_DATA

pytestmark = pytest.mark.slow


def test_adafuse_code_run_records_their_pred_and_every_round(tmp_path):
    settings = ["task=nq", "task.limit=2", f"data.dir={SHARED_DATA}", "wandb.mode=disabled", "progress=false"]
    metrics = main(compose_run(*settings, "method=adafuse_code", "trace=true"), tmp_path)
    assert metrics["method"] == {"name": "adafuse_code", "tau": 0.7, "branches": 3, "span_length": 1, "max_rounds": 5}
    assert metrics["n"] == 2 and "paper_em" in metrics["metrics"]
    for line in (tmp_path / "predictions.jsonl").read_text().splitlines():
        record = json.loads(line)
        notes, rounds = record["stats"]["notes"], record["trace"]["steps"]
        assert notes["authors_stop"] in ("marker", "boxed", "eos_string", "rounds", "no_valid_candidates")
        assert len(rounds) == record["stats"]["rounds"] <= 5
        assert "".join(r["appended"] for r in rounds) == record["prediction"]
        assert authors_pred(record["prediction"]) == notes["authors_pred"]
        for r in rounds:
            assert len(r["proposals"]) == 2 and all(len(e["scores"]) == 2 for e in r["pool"])
