"""The paper's main command, `python run.py model_pair=llama_mistral task=nq`, end to end on the pair
in shape (tests/support/paper_pair.py): both real tokenizers, the hub's configs, bfloat16 weights as its YAMLs
load them. The outputs are meaningless text; what is checked is that the run completes and writes
what a run writes, and that no control token reaches a prediction."""

import json
import re

import pytest

import eval.runner
from conf.compose import compose_run
from eval.runner import main
from tests.support.paper_pair import overrides
from tests.support.paths import SHARED_DATA

CONTROL_TEXT = re.compile(r"<\|[a-z_0-9]+\|>|\[control_\d+\]|\[/?INST\]|\[TOOL_CALLS\]|</s>|<s>|<unk>")


@pytest.mark.parametrize("method", ["adafuse", "unite"])
def test_the_papers_main_command_runs_on_the_shaped_pair(paper_pair_dir, tmp_path, monkeypatch, method):
    # The runner keeps one pair's members loaded; a pair of its own here leaves the tiny pair's for the other tests.
    monkeypatch.setattr(eval.runner, "_LOADED", {})
    cfg = compose_run(
        "model_pair=llama_mistral",
        *overrides(paper_pair_dir),
        "task=nq",
        f"method={method}",
        "task.limit=2",
        "task.max_new_tokens=12",
        f"data.dir={SHARED_DATA}",
        "wandb.mode=disabled",
        "progress=false",
    )
    assert [m.dtype for m in cfg.model_pair.members.values()] == ["bfloat16", "bfloat16"]
    metrics = main(cfg, tmp_path)
    assert metrics["n"] == 2 and set(metrics["metrics"]) >= {"em", "f1", "paper_em"}
    records = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        assert record["prediction"] and not CONTROL_TEXT.search(record["prediction"]), record["prediction"]
