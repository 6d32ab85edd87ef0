"""What a run records on the bundled pair: what it read (each data file's sha256, each model's checksum), where
it ran (torch, each model's device and dtype as loaded) and how each model's requests met; and what it refuses
before any model loads: a resume from other data or on another device or dtype, a run directory it cannot
write."""

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

import eval.runner
from adafuse import model_config
from adafuse.errors import ResultsDirError, ResumeMismatchError
from conf.compose import compose_run
from eval.runner import main
from tests.support.paths import ROOT, SHARED_DATA

pytestmark = pytest.mark.slow

QUICK = ["task=nq", f"data.dir={SHARED_DATA}", "wandb.mode=disabled", "progress=false", "task.max_new_tokens=4"]


def run(out, *overrides: str) -> dict | None:
    return main(compose_run(*QUICK, *overrides), out)


def no_model_may_load(monkeypatch) -> None:
    def refuse(*args):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(eval.runner, "load_ensemble", refuse)


def test_config_and_metrics_record_the_device_and_dtype_the_models_loaded_with(tiny, tmp_path):
    # The runner's loaded models are the `tiny` fixture's (the same cache entries).
    metrics = run(tmp_path, "method=adafuse", "task.limit=2")
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["runtime"]
    loaded = [
        {"name": m.name, "device": str(m.model.device), "dtype": str(m.model.dtype).removeprefix("torch."), "gpu": None}
        for m in tiny.members
    ]
    # and how each model's passes ran, once it had loaded: the CPU's exact backend, batch-invariant
    passes = [model.pop("passes") for model in recorded["models"]]
    assert recorded == {"torch": str(torch.__version__), "models": loaded}
    assert passes == [m.runner.backend.describe(m.runner.prepared, exact=True) for m in tiny.members]
    assert {p["backend"] for p in passes} == {"cpu-exact"} and all(p["batch_invariant"] for p in passes)
    recorded["models"] = [model | {"passes": p} for model, p in zip(recorded["models"], passes)]
    assert "auto" not in json.dumps(recorded)
    assert metrics["runtime"] == recorded

    # What it read: data.dir resolved, each file with its sha256; each model's pinned checksum.
    source = yaml.safe_load((tmp_path / "config.yaml").read_text())["source"]
    files = ["nq_open/NQ-open.dev.jsonl", "nq_open/NQ-open.efficientqa.dev.1.1.jsonl"]
    assert source["data"] == {
        "local": str(SHARED_DATA.resolve()),
        "files": {name: hashlib.sha256((SHARED_DATA / name).read_bytes()).hexdigest() for name in files},
        "hub": [],
    }
    assert source["models"] == [
        {"name": m.name, "bundle": m.name, "sha256": model_config(m.name).sha256} for m in tiny.members
    ]
    assert metrics["source"] == source

    # Exact batching, two examples in flight: both models' passes met, attention per request.
    batching = metrics["batching"]
    assert (batching["batch_size"], batching["exact"], batching["side_by_side"]) == (8, True, True)
    assert batching["batch_invariant"]
    assert list(batching["models"]) == ["smollm2_135m", "gemma3_270m"]
    for how in batching["models"].values():
        assert how["attention"] == "per_request" and how["linear"] == "row_tiles"
        assert 0 < how["merged_passes"] <= how["passes"] <= how["rows"]
        assert 0 < how["seconds"] < metrics["throughput"]["seconds"]
    assert json.loads((tmp_path / "metrics.json").read_text())["batching"] == batching


def test_metrics_add_up_the_batching_of_every_process_that_decoded(tmp_path):
    first = run(tmp_path, "method=single", "task.limit=1", "batch_size=1", "batch_exact=false")
    whole = run(tmp_path, "method=single", "task.limit=2", "batch_size=1", "batch_exact=false")  # resumes: one more
    lines = [json.loads(line) for line in (tmp_path / "batching.jsonl").read_text().splitlines()]
    assert [line["examples"] for line in lines] == [1, 1]
    once, twice = first["batching"]["models"]["smollm2_135m"], whole["batching"]["models"]["smollm2_135m"]
    assert (twice["attention"], twice["linear"]) == ("per_request", "stock")  # inexact: the stock kernels
    assert not whole["batching"]["batch_invariant"]
    assert twice["merged_passes"] == 0  # one example in flight: nothing to meet
    assert twice["passes"] == sum(line["models"]["smollm2_135m"]["passes"] for line in lines) > once["passes"]


def test_a_resume_on_another_device_and_dtype_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    run(tmp_path, "method=single", "task.limit=1")
    # As if the run had been started on a GPU node: `device: auto` and `dtype: auto` resolved there.
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["runtime"]["models"][0] |= {"device": "cuda:0", "dtype": "bfloat16", "gpu": "NVIDIA H200"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    no_model_may_load(monkeypatch)
    with pytest.raises(ResumeMismatchError, match="smollm2_135m device cuda:0 then, cpu now") as refused:
        run(tmp_path, "method=single", "task.limit=2")
    assert "smollm2_135m dtype bfloat16 then, float32 now" in str(refused.value)
    assert len((tmp_path / "predictions.jsonl").read_text().splitlines()) == 1


def test_an_unwritable_results_dir_is_a_named_error_before_any_model_loads(tmp_path, monkeypatch):
    blocker = tmp_path / "results"
    blocker.write_text("a file where a folder should be")  # stops root too (CI runs as root)
    no_model_may_load(monkeypatch)
    with pytest.raises(ResultsDirError, match=f"{blocker} is a file, not a folder"):
        run(blocker / "nq" / "single" / "tiny" / "default", "method=single", "task.limit=1")


@pytest.mark.parametrize("mode", [[], ["-m"]], ids=["run", "sweep"])
def test_the_command_line_names_an_unwritable_results_dir_in_one_line(tmp_path, mode):
    blocker = tmp_path / "results"
    blocker.write_text("a file where a folder should be")
    command = [sys.executable, str(ROOT / "run.py"), *mode, f"results_dir={blocker / 'sub'}", "method=single", *QUICK]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert f"ResultsDirError: cannot create or write the run directory {blocker / 'sub'}" in output
    assert f"{blocker} is a file, not a folder" in output and "Traceback" not in output


def test_a_resume_from_other_data_is_refused_before_any_model_loads_and_the_same_data_moved_resumes(
    tmp_path, monkeypatch
):
    """data.dir is free to change (the same files elsewhere), what it holds is not: a run whose data files changed
    under it (or moved to the hub, or to another hub commit) would finish with other prompts under the same ids."""
    first, moved = tmp_path / "data", tmp_path / "elsewhere"
    shutil.copytree(SHARED_DATA / "nq_open", first / "nq_open")
    out = tmp_path / "run"
    run(out, "method=single", "task.limit=1", f"data.dir={first}")
    shutil.copytree(first, moved)
    run(out, "method=single", "task.limit=2", f"data.dir={moved}")  # the same files: it resumes and grows
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2

    pool = moved / "nq_open" / "NQ-open.efficientqa.dev.1.1.jsonl"  # the exemplars: every prompt changes
    pool.write_text("".join(reversed(pool.read_text().splitlines(keepends=True))))
    no_model_may_load(monkeypatch)
    with pytest.raises(ResumeMismatchError, match="data file nq_open/NQ-open.efficientqa.dev.1.1.jsonl: sha256"):
        run(out, "method=single", "task.limit=3", f"data.dir={moved}")
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2
