"""method=sweetspan and method=llm_blender through the harness: results written, scored, and recorded."""

import json

import pytest

from adafuse.errors import ConfigError
from conf.compose import compose_run
from eval.runner import main
from tests.support.paths import SHARED_DATA

pytestmark = pytest.mark.slow


def run(tmp_path, *overrides: str) -> tuple[dict, list[dict]]:
    settings = ["task=nq", "task.limit=2", f"data.dir={SHARED_DATA}", "wandb.mode=disabled", "progress=false"]
    metrics = main(compose_run(*settings, *overrides), tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    return metrics, [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]


def test_sweetspan_run(tmp_path):
    metrics, records = run(tmp_path, "method=sweetspan", "trace=true")
    assert metrics["method"] == {
        "name": "sweetspan",
        "span_words": 4,
        "outlier_ratio": 10.0,
        "normalize": False,
        "max_word_tokens": 16,
        "score": "nll",
    }
    assert metrics["n"] == 2 and set(metrics["metrics"]) == {"em", "f1", "paper_em"}
    for r in records:
        assert "\n" not in r["prediction"] and r["stats"]["stop_reason"] in ("stop", "eos", "length")
        rounds = r["trace"]["steps"]
        assert len(rounds) == r["stats"]["rounds"] and all(1 <= w <= 4 for w in r["stats"]["words_per_round"])
        assert "".join(x["candidates"][x["winner"]]["text"] for x in rounds).startswith(r["prediction"])


def test_llm_blender_run_says_which_ranker_ran(tmp_path):
    metrics, records = run(tmp_path, "method=llm_blender")
    assert metrics["method"] == {"name": "llm_blender", "ranker": "nll", "pairrm_path": "llm-blender/PairRM"}
    for r in records:
        assert r["stats"]["notes"]["ranker"] == "nll" and r["stats"]["notes"]["chosen"] in (0, 1)


def test_a_pairrm_path_without_a_checkpoint_fails_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="holds no config.json"):
        main(compose_run("method=llm_blender", "method.ranker=pairrm", f"method.pairrm_path={tmp_path}"), tmp_path)
    with pytest.raises(ConfigError, match="span_words must be >= 1"):
        main(compose_run("method=sweetspan", "method.span_words=0"), tmp_path)
