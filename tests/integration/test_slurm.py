"""Sweeps on a real single-node SLURM cluster (`bash slurm/cluster.sh start`; .ci/run starts it):
a Hydra multirun through the submitit launcher, and a job preempted mid-run that submitit requeues
and that finishes with every example exactly once. Skipped where no cluster answers."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT, SHARED_DATA
from tests.support.runs import read_predictions

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The launcher's defaults ask for an A100 node; this cluster is two CPUs. Two jobs run at a time.
LAUNCHER = [
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=null",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=4",
    "hydra.launcher.timeout_min=30",
]
COMMON = [f"data.dir={SHARED_DATA}", "wandb.mode=disabled", "progress=false", "threads=1"]


def sweep(cwd: Path, *overrides: str) -> subprocess.Popen:
    """`python run.py -m ...` from `cwd`, which then holds results/ and multirun/."""
    command = [sys.executable, str(ROOT / "run.py"), "-m", *LAUNCHER, *COMMON, *overrides]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen, timeout: float) -> str:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    assert proc.returncode == 0, output[-4000:]
    return output


def git_head() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def job_states(job: str) -> list[str]:
    """The states of every run of a job, from the accounting database, once the last one has ended."""
    deadline = time.time() + 60
    while True:
        command = ["sacct", "-j", job, "--duplicates", "--noheader", "--allocations", "--format=State"]
        states = subprocess.run(command, capture_output=True, text=True).stdout.split()
        if time.time() > deadline or (states and states[-1] not in ("PENDING", "RUNNING", "COMPLETING")):
            return states
        time.sleep(1)  # the submitter sees the result file before slurmctld records the end


def test_a_sweep_runs_one_job_per_combination_as_one_array_job(cluster, tmp_path):
    # two tasks by two methods: four jobs, each its own run directory (two short prompts: a job's time is
    # its start-up, as on a cluster, not a long few-shot prompt read on one CPU)
    output = finished(
        sweep(tmp_path, "task=nq,triviaqa", "method=adafuse,single", "task.limit=1", "task.max_new_tokens=4"), 900
    )
    for task in ("nq", "triviaqa"):
        for method in ("adafuse", "single"):
            run = tmp_path / "results" / task / method / "tiny" / "task.max_new_tokens=4"
            assert f"writes to {run}" in output  # said before the jobs ran
            metrics = json.loads((run / "metrics.json").read_text())
            assert (metrics["task"], metrics["method"]["name"], metrics["n"]) == (task, method, 1)
            assert len(read_predictions(run)) == 1
            assert metrics["environment"]["git_sha"] == git_head()  # the jobs ran this checkout's code
    (sweep_dir,) = (tmp_path / "multirun").glob("*/*")
    assert (sweep_dir / "multirun.yaml").is_file()
    results = tmp_path / "results"
    assert not list(results.rglob("multirun.yaml")) and not list(results.rglob(".submitit"))
    jobs = sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name))
    array = jobs[0].split("_")[0]
    assert jobs == [f"{array}_{i}" for i in range(4)]  # <array job id>_<task id>: one array job


def test_a_preempted_job_is_requeued_and_finishes_every_example_exactly_once(cluster, tmp_path):
    proc = sweep(tmp_path, "task=nq", "task.limit=4", "task.max_new_tokens=4", "batch_size=1")
    run = tmp_path / "results" / "nq" / "adafuse" / "tiny" / "task.max_new_tokens=4"
    predictions = run / "predictions.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and (not predictions.exists() or predictions.read_text().count("\n") < 1):
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        time.sleep(0.5)
    # submitit's folder per job: <job id>, or <array job id>_<task id> for a sweep of several
    (job,) = [p.name for p in tmp_path.glob("multirun/*/*/.submitit/*") if re.fullmatch(r"\d+(_\d+)?", p.name)]
    # Preemption as submitit expects it: SIGUSR2 to the job, whose handler checkpoints the launcher,
    # requeues the job (scontrol requeue) and exits; the requeued job resumes from predictions.jsonl.
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    before = predictions.read_text().splitlines()
    finished(proc, 600)

    after = predictions.read_text().splitlines()
    ids = [json.loads(line)["id"] for line in after]
    assert sorted(ids) == sorted(f"nq-{i}" for i in range(4)), "every example exactly once"
    assert after[: len(before)] == before  # nothing written before the preemption was lost or redone
    assert len(before) < 4, "the job should have been preempted part-way"
    assert job_states(job) == ["REQUEUED", "COMPLETED"]
    assert json.loads((run / "metrics.json").read_text())["n"] == 4
