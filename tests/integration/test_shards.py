"""A task in shards: every shard writes into one run directory, metrics.json appears once every
example has a prediction (written by the last shard, or by scripts/merge.py), a shard has one writer."""

import json

import pytest

from adafuse.errors import ShardBusyError
from eval.results import RunDir
from tests.support.run_in_process import run_script
from tests.support.runs import decoded, read_predictions, run_task

pytestmark = pytest.mark.slow


def merge(run_dir):
    return run_script("merge", str(run_dir))


def test_shards_fill_one_run_and_the_last_one_writes_the_metrics(tmp_path):
    out = tmp_path / "run"
    assert run_task("nq", "single", out, "task.num_shards=2", "task.shard=1") is None
    assert sorted(r["id"] for r in read_predictions(out)) == ["nq-1", "nq-3"]  # written as they finish
    assert not (out / "metrics.json").exists()
    waiting = merge(out)
    assert waiting.returncode == 1 and "3 of 5 examples have no prediction yet (nq-0, nq-2, nq-4)" in waiting.stderr

    metrics = run_task("nq", "single", out, "task.num_shards=2", "task.shard=0")
    whole = run_task("nq", "single", tmp_path / "whole")
    assert metrics["n"] == 5 and metrics["ids"] == [f"nq-{i}" for i in range(5)]
    assert metrics["metrics"] == whole["metrics"]  # sharding changes no prediction
    by_id = {r["id"]: decoded(r) for r in read_predictions(tmp_path / "whole")}
    assert sorted(r["id"] for r in read_predictions(out)) == sorted(by_id)
    assert all(decoded(r) == by_id[r["id"]] for r in read_predictions(out))

    (out / "metrics.json").unlink()  # as if the last shard had died after its last prediction
    done = merge(out)
    assert done.returncode == 0, done.stderr
    merged = json.loads((out / "metrics.json").read_text())
    assert {k: v for k, v in merged.items() if k != "created"} == {k: v for k, v in metrics.items() if k != "created"}


def test_a_second_writer_of_the_same_shard_is_refused_before_any_model_loads(tmp_path):
    out = tmp_path / "run"
    with RunDir(out, {}).claim(1, 3):  # another process decoding shard 1 of 3
        with pytest.raises(ShardBusyError, match="shard 1 of 3"):
            run_task("nq", "single", out, "task.num_shards=3", "task.shard=1")
        assert run_task("nq", "single", out, "task.num_shards=3", "task.shard=2") is None  # another shard may run
    assert [r["id"] for r in read_predictions(out)] == ["nq-2"]
