"""The GPU check's parts that need no GPU (tools/gpu_check.py): how it follows a stage's child process to its
deadline, that a failed job keeps its exception's text, the run.py command lines it composes, the layers it picks
for the timing runs, and what it concludes from the runs. Its whole dry run is tests/integration/test_gpu_check.py."""

import json
import os
import sys
import time

import pytest

from conf.compose import compose_run
from eval.runner import settings_of
from tests.support.paths import ROOT
from tools import gpu_check


def child(tmp_path, body: str) -> list[str]:
    """A child process in the shape of the check's (`gpu_check.child`): `body` runs, `say(event, name, **record)`."""
    script = (
        "import json, sys, time\n"
        "def say(event, name, **record):\n"
        f"    with open({str(tmp_path / 'records.jsonl')!r}, 'a') as f:\n"
        "        f.write(json.dumps({'event': event, 'name': name, **record}) + '\\n')\n" + body
    )
    return [sys.executable, "-c", script]


def test_a_job_running_at_the_deadline_is_cut_and_the_jobs_after_it_skipped(tmp_path):
    command = child(tmp_path, "say('end', 'a', answer=42)\nsay('start', 'b')\ntime.sleep(60)\n")
    started = time.perf_counter()
    records, log = tmp_path / "records.jsonl", tmp_path / "log"
    found = dict(gpu_check.child_records(command, ["a", "b", "c"], records, log, seconds=3))
    assert time.perf_counter() - started < 30  # stopped at its deadline, not after its minute of sleep
    assert found["a"] == {"answer": 42}
    assert found["b"]["cut"].startswith("stopped at the deadline after")
    assert found["c"] == {"skipped": "out of time"}


def test_a_child_that_dies_in_a_job_leaves_its_log_in_the_record(tmp_path):
    command = child(tmp_path, "say('start', 'a')\nprint('CUDA out of memory', flush=True)\nsys.exit(3)\n")
    found = dict(gpu_check.child_records(command, ["a", "b"], tmp_path / "records.jsonl", tmp_path / "log", 60))
    assert found["a"]["error"] == "the process died in this job (status 3)"
    assert "CUDA out of memory" in found["a"]["log"]
    assert found["b"]["skipped"] == "the process died before it (status 3)"


def test_a_failed_job_keeps_its_exception_and_a_refused_run_its_line(tmp_path, shared_data):
    """The check's own child process: run.py refusing a bad setting (before any model loads) says which, and a job
    that raises keeps its exception's type and text; the job after a failed one still runs."""
    refused = gpu_check.Run("refused")
    task = {"task": "nq", "limit": 1, "budget": 1, "data_dir": str(shared_data)}
    settings = [*gpu_check.overrides(refused, tmp_path / "pair", task, tmp_path / "runs"), "method.tau=-0.1"]
    missing = {"kind": "generate", "name": "missing", "path": str(tmp_path / "nowhere"), "device": "cpu"} | task
    jobs = [{"kind": "run", "name": "refused", "overrides": settings, "results": str(tmp_path / "runs")}, missing]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"deadline": time.time() + 120, "jobs": jobs}))
    command = [sys.executable, "-m", "tools.gpu_check", "--child", str(plan), str(tmp_path / "records.jsonl")]
    env = os.environ | {"HYDRA_FULL_ERROR": "1", "PYTHONPATH": str(ROOT)}
    found = dict(gpu_check.child_records(command, ["refused", "missing"], tmp_path / "records.jsonl",
                                         tmp_path / "log", 120, env, cwd=tmp_path))  # fmt: skip
    assert found["refused"]["error"] == (
        "RuntimeError: run.py refused the run (status 2): "
        "ConfigError: tau must be >= 0 (tau > 1 means 'never confident'), got -0.1"
    ), found["refused"]
    assert found["missing"]["error"].startswith("OSError: ") and "nowhere" in found["missing"]["error"]
    assert "Traceback" in found["missing"]["traceback"]


def test_every_run_of_the_plan_composes_as_the_settings_it_names(tmp_path):
    """Each run's command line goes through Hydra and the schemas as run.py's would: the paper's pair at the check's
    folders, exact batching, and the task, batch size and method it stands for."""
    pair = tmp_path / "pair"
    runs = [run for run in gpu_check.SMOKE + gpu_check.TIMING if run.generate is None]
    assert {run.batch_size for run in runs} == {1, 8, 32} and {run.method for run in runs} == {
        "adafuse",
        "unite",
        "sweetspan",
    }
    for run in runs:
        task = {"task": run.task, "limit": 16, "budget": 32, "data_dir": str(tmp_path / "data")}
        composed = settings_of(compose_run(*gpu_check.overrides(run, pair, task, tmp_path / "runs" / run.name)))
        members = list(composed.model_pair.members.values())
        assert composed.model_pair.name == "llama_mistral"
        assert [m.path for m in members] == [str(pair / name) for name in gpu_check.NAMES]
        assert [(m.dtype, m.device) for m in members] == [("bfloat16", "auto")] * 2
        assert (composed.task.name, composed.task.limit, composed.task.max_new_tokens) == (run.task, 16, 32)
        assert (composed.batch_size, composed.batch_exact, composed.method.name) == (run.batch_size, True, run.method)
        assert composed.results_dir == str(tmp_path / "runs" / run.name)


def smoke(decode: float) -> dict:
    """A smoke stage's record: a pair of 2 layers (1 GB fixed, 0.5 GB a layer, written in 4 s), whose AdaFuse run at
    batch 8 took `decode` seconds to decode in 12 s of wall time, 2 s of them probing."""
    model = {"seconds": 2.0, "bytes": 10**9, "layer_bytes": 2.5 * 10**8, "layers": 2}
    build = {"models": {"llama31_8b_instruct": model, "mistral7b_instruct_v03": model}}
    passes = {name: {"probe_seconds": 1.0} for name in gpu_check.NAMES}  # not loading: not counted per byte
    return {"build": build, "adafuse_exact_b8": {"decode_seconds": decode, "wall_seconds": 12.0, "passes": passes}}


def test_the_timing_runs_get_as_many_layers_as_their_estimate_fits_in_the_time_left(tmp_path):
    check = gpu_check.Check(gpu_check.GPU, tmp_path / "check.json", tmp_path, dry_run=False, limit=400, layers=None)
    check.record["smoke"] = smoke(decode=2.05)  # off the whole seconds: no tie at the limit
    chosen = check.choose_layers()
    assert 2 < chosen < gpu_check.REAL_LAYERS  # 400 s fit more than the smoke's 2 layers, not all 32
    layers = json.loads((tmp_path / "check.json").read_text())["layers"]
    fits = 0.85 * layers["seconds_left"]
    assert layers["estimate"]["seconds"] <= fits < gpu_check.estimate(smoke(2.05), chosen + 1, 2)["seconds"]
    check.record["smoke"] = smoke(decode=0.01)
    assert check.choose_layers() == gpu_check.REAL_LAYERS
    check.record["smoke"] = {"adafuse_exact_b8": {"error": "RuntimeError: ..."}}
    assert check.choose_layers() == gpu_check.SMOKE_LAYERS  # nothing to estimate from: the smoke pair again
    assert "did not decode" in json.loads((tmp_path / "check.json").read_text())["layers"]["why"]


def test_a_ratio_takes_whole_runs_only():
    whole = {"decode_seconds": 2.0}
    runs = {"adafuse_exact_b8": whole, "generate_llama_b1": whole, "generate_mistral_b1": {"cut": "stopped"}}
    assert gpu_check.ratios(runs)["adafuse_b8_over_summed_generate_b1"] is None
    runs["generate_mistral_b1"] = {"decode_seconds": 6.0}
    runs["unite_b8"] = {"decode_seconds": 1.6}
    found = gpu_check.ratios(runs)
    assert found["adafuse_b8_over_summed_generate_b1"] == 0.25 and found["adafuse_b8_over_unite_b8"] == 1.25


def test_texts_are_compared_over_the_examples_both_runs_decoded():
    texts = {
        "adafuse_exact_b8": {"q1": "Paris", "q2": "1969", "q3": "Oslo"},
        "adafuse_exact_b1": {"q1": "Paris", "q2": "1970"},
    }
    assert gpu_check.identical(texts) == {"adafuse_exact_b8_vs_adafuse_exact_b1": {"examples": 2, "texts": 1}}
    assert gpu_check.identical({"adafuse_exact_b8": {}}) == {"adafuse_exact_b8_vs_adafuse_exact_b1": None}


def test_batch_8_texts_unlike_batch_1_meet_the_goal_only_where_the_run_says_why_it_is_batch_dependent():
    same = {"adafuse_exact_b8_vs_adafuse_exact_b1": {"examples": 8, "texts": 7}}
    passes = {"llama31_8b_instruct": {"backend": "cuda", "failing": ["linear"], "probe_errors": [], "toolchain": []}}
    said = gpu_check.batch_goal({"adafuse_exact_b8": {"batch_invariant": False, "passes": passes}}, same)
    silent = gpu_check.batch_goal({"adafuse_exact_b8": {"batch_invariant": True, "passes": passes}}, same)
    assert said["met"] is True and said["why"]["llama31_8b_instruct"]["failing"] == ["linear"]
    assert silent == {"texts": "7/8", "batch_invariant": True, "met": False}
    assert gpu_check.batch_goal({}, None) == {"met": None}


def test_gsm8k_memory_at_fewer_layers_is_grown_to_the_real_ones():
    """At 8 of 32 layers: the weights by the 24 missing layers' bytes, the rest of the peak four times over."""
    model = {"bytes": 4 * 2**30, "layer_bytes": 2**29, "layers": 8}
    pair = {"models": {"a": model, "b": model}}
    run = {"decode_seconds": 9.0, "memory": {"cuda:0": {"peak_reserved_gb": 10.0}}}
    found = gpu_check.memory_goal(run, pair)
    assert found == {"peak_gb": 10.0, "layers": 8, "at_real_layers_gb": 8 + 24 + 2 * 4, "met": True}
    run["memory"]["cuda:0"]["peak_reserved_gb"] = 21.0
    assert gpu_check.memory_goal(run, pair)["met"] is False  # 8 + 24 + 13 * 4 = 84
    failed = {"error": "OutOfMemoryError: CUDA out of memory", "memory": {}}
    assert gpu_check.memory_goal(failed, pair) == {"error": failed["error"], "met": False}
    assert gpu_check.memory_goal({"skipped": "out of time"}, pair)["met"] is None


@pytest.mark.parametrize("scale", [gpu_check.GPU, gpu_check.DRY_RUN], ids=["gpu", "dry_run"])
def test_the_stage_budgets_leave_the_timing_runs_time(scale):
    assert sum(scale.budgets.values()) < 0.6 * scale.limit
    assert scale.smoke_layers <= scale.max_layers <= gpu_check.REAL_LAYERS
