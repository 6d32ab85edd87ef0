"""The GPU checks' parts that need no GPU: the step record (tools/gpu_record.py) with its one deadline and its JSON
written as each step ends; and of `gpu_check --full` (tools/gpu_full.py), how it follows a child process to its
deadline, the run.py command lines it composes, and what it concludes from the runs."""

import json
import sys
import time

from conf.compose import compose_run
from eval.runner import settings_of
from tools import gpu_full
from tools.gpu_record import StepRecord


def test_a_step_past_the_deadline_is_skipped_and_says_so(tmp_path):
    late = StepRecord(tmp_path / "late.json", 0.0, {})
    assert late.step("decode", lambda left: {"ran": True})["skipped"] == "out of time"
    assert "ran" not in json.loads((tmp_path / "late.json").read_text())["decode"]


def test_each_step_is_written_as_it_ends_a_failing_one_with_its_error(tmp_path):
    out = tmp_path / "check.json"
    record = StepRecord(out, 60.0, {"dry_run": True})
    record.step("fails", lambda left: {"quotient": 1 / 0})
    assert json.loads(out.read_text())["fails"]["error"] == "ZeroDivisionError: division by zero"
    record.step("runs", lambda left: {"left": left})
    written = json.loads(out.read_text())
    assert written["dry_run"] is True and 0 < written["runs"]["left"] <= 60 and "error" in written["fails"]


def child(tmp_path, body: str) -> list[str]:
    """A child process in the shape of tools/gpu_runs.py: `body` runs with `say(event, name, **record)`."""
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
    found = dict(
        gpu_full.child_records(command, ["a", "b", "c"], tmp_path / "records.jsonl", tmp_path / "log", seconds=3)
    )
    assert time.perf_counter() - started < 30  # stopped at its deadline, not after its minute of sleep
    assert found["a"] == {"answer": 42}
    assert found["b"]["cut"].startswith("stopped at the deadline after")
    assert found["c"] == {"skipped": "out of time"}


def test_a_child_that_dies_in_a_job_leaves_its_log_in_the_record(tmp_path):
    command = child(tmp_path, "say('start', 'a')\nprint('CUDA out of memory', flush=True)\nsys.exit(3)\n")
    found = dict(gpu_full.child_records(command, ["a", "b"], tmp_path / "records.jsonl", tmp_path / "log", 60))
    assert found["a"]["error"] == "the process died in this job (status 3)"
    assert "CUDA out of memory" in found["a"]["log"]
    assert found["b"]["skipped"] == "the process died before it (status 3)"


def test_every_run_of_the_plan_composes_as_the_settings_it_names(tmp_path):
    """Each run's command line goes through Hydra and the schemas as run.py's would: the paper's pair at the
    check's folders, and the batch size, exactness, method and member (and, on two GPUs, one GPU) it stands for."""
    pair = tmp_path / "pair"
    runs = [run for run in gpu_full.FIRST + gpu_full.WARM if isinstance(run, gpu_full.Run)]
    assert {run.batch_size for run in runs} == {1, 8, 32} and {run.task for run in runs} == {"nq", "gsm8k"}
    for run in runs:
        settings = gpu_full.overrides(run, pair, tmp_path / "data", tmp_path / "runs" / run.name, 16, 32)
        composed = settings_of(compose_run(*settings))
        members = list(composed.model_pair.members.values())
        assert composed.model_pair.name == "llama_mistral"
        assert [m.path for m in members] == [str(pair / name) for name in gpu_full.NAMES]
        assert [m.dtype for m in members] == ["bfloat16", "bfloat16"]
        assert [m.device for m in members] == (["cuda:0", "cuda:0"] if run.one_gpu else ["auto", "auto"])
        assert (composed.task.name, composed.task.limit, composed.task.max_new_tokens) == (run.task, 16, 32)
        assert (composed.batch_size, composed.batch_exact) == (run.batch_size, run.exact)
        assert composed.method.name == run.method
        assert getattr(composed.method, "member", None) == run.member
        assert composed.results_dir == str(tmp_path / "runs" / run.name)


def test_a_ratio_takes_whole_runs_only():
    whole = {"decode_seconds": 2.0}
    runs = {"adafuse_exact_b8_warm": whole, "generate_llama_b1": whole, "generate_mistral_b1": {"cut": "stopped"}}
    assert gpu_full.ratios(runs)["adafuse_exact_b8_over_summed_generate_b1"] is None
    runs["generate_mistral_b1"] = {"decode_seconds": 6.0}
    assert gpu_full.ratios(runs)["adafuse_exact_b8_over_summed_generate_b1"] == 0.25


def test_texts_are_compared_over_the_examples_both_runs_decoded():
    texts = {"adafuse_exact_b8": {"q1": "Paris", "q2": "1969"}, "adafuse_exact_b1": {"q1": "Paris", "q2": "1970"}}
    texts["adafuse_exact_b32"] = {"q1": "Paris", "q3": "Oslo"}
    same = gpu_full.identical(texts)
    assert same["adafuse_exact_b8_vs_adafuse_exact_b1"] == {"examples": 2, "texts": 1}
    assert same["adafuse_exact_b32_vs_adafuse_exact_b1"] == {"examples": 1, "texts": 1}
    assert same["single_llama_b8_vs_single_llama_b1"] is None


def test_batch_8_texts_unlike_batch_1_meet_the_goal_only_where_the_run_says_it_is_batch_dependent():
    same = {"adafuse_exact_b8_vs_adafuse_exact_b1": {"examples": 16, "texts": 15}}
    ratio = {"adafuse_exact_b8_over_summed_generate_b1": 0.8}
    said = gpu_full.goals({"adafuse_exact_b8": {"batch_invariant": False}}, same, ratio)
    silent = gpu_full.goals({"adafuse_exact_b8": {"batch_invariant": True}}, same, ratio)
    assert said["batch_8_texts_equal_batch_1_or_said_batch_dependent"]["met"] is True
    assert silent["batch_8_texts_equal_batch_1_or_said_batch_dependent"] == {
        "texts": "15/16",
        "batch_invariant": True,
        "met": False,
    }
    assert silent["adafuse_b8_at_most_summed_generate_b1"] == {"ratio": 0.8, "met": True}
    gsm8k = silent["gsm8k_b32_without_running_out_of_memory"]
    assert gsm8k["met"] is None  # it never ran: not known
    failed = {"gsm8k_adafuse_exact_b32": {"error": "OutOfMemoryError: CUDA out of memory", "memory": {}}}
    assert gpu_full.goals(failed, same, ratio)["gsm8k_b32_without_running_out_of_memory"]["met"] is False
