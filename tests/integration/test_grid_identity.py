"""Every committed grid run (results/grid) decoded again by today's engine: its first examples, with the run's
own saved settings (config.yaml), give the committed predictions bit for bit. The engine may change its
speed and its shape, never an output.

What it needs of the host: the texts were decoded on an Intel Xeon. Another CPU's kernels may give a logit other
last bits, which changes a greedy text only at a near-tie; none of the committed runs' first examples has one on
Intel Xeon or AMD EPYC (with and without AVX-512). A failure elsewhere that a run on such a machine does not show
is a near-tie to report, not a change of the engine."""

import json
from pathlib import Path

import pytest

from conf.schema import register, saved_config
from eval.runner import main
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

GRID = ROOT / "results" / "grid"
RUNS = sorted(path.parent.relative_to(GRID) for path in GRID.glob("*/*/*/*/predictions.jsonl"))
# examples decoded again per run: the long generations (GSM8K's chains, FLORES's sentences) take one
EXAMPLES = {"gsm8k": 1, "flores_en_de": 1, "flores_de_en": 1}


def committed(run: Path) -> dict[str, str]:
    lines = (GRID / run / "predictions.jsonl").read_text().splitlines()
    return {record["id"]: record["prediction"] for record in map(json.loads, lines)}


def test_the_grid_holds_every_method_and_task():
    assert {run.parts[1] for run in RUNS} >= {"adafuse", "single", "unite", "deepen", "sweetspan", "llm_blender"}
    assert {run.parts[0] for run in RUNS} == {"nq", "triviaqa", "squad", "gsm8k", "flores_en_de", "flores_de_en"}


@pytest.mark.parametrize("run", RUNS, ids=str)
def test_a_committed_run_s_first_examples_decode_to_its_predictions(run, tiny, tmp_path):
    """`tiny` loads the bundled pair once for the session (the runner reuses it)."""
    register()
    cfg = saved_config(GRID / run / "config.yaml")
    cfg.task.limit = EXAMPLES.get(run.parts[0], 2)
    cfg.wandb.mode = "disabled"
    cfg.progress = False
    main(cfg, tmp_path)
    decoded = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(decoded) == cfg.task.limit
    expected = committed(run)
    assert {r["id"]: r["prediction"] for r in decoded} == {r["id"]: expected[r["id"]] for r in decoded}
