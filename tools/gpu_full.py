"""The paper's main setting on a GPU, on the user's own path, in one short call: one JSON.

    python -m tools.gpu_check --full             # results/bench/gpu_full.json, in under 9 minutes (--limit)
    python -m tools.gpu_check --full --dry-run   # every step on a CPU, at a small width

Llama-3.1-8B-Instruct and Mistral-7B-Instruct-v0.3 at their real width (hidden 4096, intermediate 14,336, 32
heads, 8 key/value heads; 32 layers, or fewer with --layers, recorded), with their real vocabularies, tokenizers
and hub configs and seeded random bfloat16 weights, are written to local disk in the hub's shards
(tools/make_paper_pair.py), then decoded as a user decodes them: `run.py model_pair=llama_mistral` with the two
folders as the members' paths, through Hydra, loading.py, the runner, scoring and the run directory. The work
runs in child processes (tools/gpu_runs.py), each job written to the JSON as it ends, most informative first:

1. `build`: the pair on disk (seconds, weight files, parameters per model);
2. `ops`: per op type at the pair's shapes in bfloat16 (linear at the engine's row counts and beyond, RMSNorm,
   log-softmax, attention over 1 to 32 requests), whether a row's bits alone equal its bits among others, for
   the stock kernel and for the CUDA backend's own;
3. a first process, with the probe store and Triton's cache empty, what a user's first run pays: AdaFuse exact
   at batch 8 on NQ (its wall time holds the load, the probes, compiling the kernels and the decode), AdaFuse
   exact at batch 1 on the same prompts, each member's transformers `generate()` at batch 1 on them, and
   AdaFuse exact at batch 8 again, everything loaded and compiled (the ratio's numerator);
4. a second process, the store and cache as the first left them: AdaFuse exact at batch 32 on GSM8K's 4-shot
   prompts (about 800 tokens; its memory), a profiled AdaFuse run at batch 8 (host against GPU time per pass,
   launches per pass), with two or more GPUs visible the members on one GPU against their two, AdaFuse not
   exact at batch 8, `single` per member at batch 8 and 1, AdaFuse exact at batch 32 on NQ, and on GSM8K not
   exact at batch 32 and exact at batch 8;
5. what they show: `identical` (texts compared by example: batch 8 against 1, exact against not, generate()
   against single), `ratios` (decode seconds), `probe_time` (the first run's against the second process's), and
   `goals`, issue 50's: batch 8's texts equal batch 1's or the run says it is batch-dependent; AdaFuse at batch 8
   within the members' summed generate() at batch 1; GSM8K at batch 32 without running out of memory.

A job still going at the deadline (--limit, 480 s) is stopped and recorded as cut, the jobs after it as skipped.
The dry run (`--dry-run`, tests/integration/test_gpu_full.py) runs every step on the CPU: hidden 256, 2 layers,
the real vocabularies, a few prompts, short budgets, the kernels under Triton's interpreter.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from tools import make_paper_pair
from tools.gpu_record import StepRecord, environment

ROOT = Path(__file__).resolve().parents[1]
NAMES = make_paper_pair.DEFAULT
SHORT = dict(zip(NAMES, ("llama", "mistral")))
REAL_LAYERS = 32
SIZES = {  # both models' (the vocabularies are their own, in their configs)
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": REAL_LAYERS,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
DRY_RUN_SIZES = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
}
# rows in one call at every scale: the engine's probes up to 128 (adafuse/backend/cuda/choice.py ROWS has more)
ENGINE_ROWS = (1, 2, 3, 4, 5, 8, 16, 31, 32, 64, 128)


@dataclass(frozen=True)
class Scale:
    """What a check runs at."""

    sizes: dict
    prompts: dict[str, tuple[int, int]]  # prompt set -> (task.limit, task.max_new_tokens)
    rows: tuple[int, ...]  # ops: rows in one call
    requests: tuple[int, ...]  # ops: requests in one attention call
    max_out_features: int | None  # ops: linear outputs probed at most (None: every one)
    shard_bytes: int  # the weight files' shards
    limit: float  # seconds for every step together


FULL = Scale(
    sizes=SIZES,
    prompts={"nq": (16, 32), "nq_b32": (32, 32), "gsm8k": (32, 64), "profile": (8, 8)},
    # and the row counts a merged pass that reads 32 GSM8K prompts reaches: thousands
    rows=(*ENGINE_ROWS, 256, 1024, 4096),
    requests=(1, 2, 5, 16, 32),
    max_out_features=None,
    shard_bytes=5 * 10**9,  # the hub's
    limit=480.0,  # with the interpreter's start and the wheels' install, the call stays under 9 minutes
)
DRY_RUN = Scale(
    sizes=DRY_RUN_SIZES,
    prompts={"nq": (3, 4), "nq_b32": (4, 4), "gsm8k": (3, 4), "profile": (2, 3)},
    rows=(1, 2, 3, 8),
    requests=(1, 2, 5),
    max_out_features=2048,  # Triton's interpreter takes about 20 s for one multiply by a 128,256-row head
    shard_bytes=64 * 2**20,  # several shards, as at the real sizes
    limit=900.0,
)


@dataclass(frozen=True)
class Run:
    """One run.py run of the check."""

    name: str
    task: str = "nq"
    prompts: str = "nq"  # the Scale's prompt set
    method: str = "adafuse"
    batch_size: int = 8
    exact: bool = True
    member: int | None = None  # `single`'s
    profile: bool = False  # under torch.profiler: the host/GPU split
    one_gpu: bool = False  # both members on cuda:0, against `device: auto`'s two GPUs (only with two or more)


@dataclass(frozen=True)
class Generate:
    """One member's transformers `generate()` at batch 1 on the NQ prompts."""

    name: str
    member: int


# A fresh process, the probe store and Triton's cache empty: what a user's first run pays.
FIRST = [
    Run("adafuse_exact_b8"),
    Run("adafuse_exact_b1", batch_size=1),
    Generate("generate_llama_b1", 0),
    Generate("generate_mistral_b1", 1),
    Run("adafuse_exact_b8_warm"),
]
# A second process: the probe store and Triton's cache as the first left them.
WARM = [
    Run("gsm8k_adafuse_exact_b32", task="gsm8k", prompts="gsm8k", batch_size=32),
    Run("adafuse_profile_b8", prompts="profile", profile=True),
    Run("adafuse_exact_b8_one_gpu", one_gpu=True),
    Run("adafuse_not_exact_b8", exact=False),
    Run("single_llama_b8", method="single", member=0),
    Run("single_llama_b1", method="single", member=0, batch_size=1),
    Run("single_mistral_b8", method="single", member=1),
    Run("single_mistral_b1", method="single", member=1, batch_size=1),
    Run("adafuse_exact_b32", prompts="nq_b32", batch_size=32),
    Run("gsm8k_adafuse_not_exact_b32", task="gsm8k", prompts="gsm8k", batch_size=32, exact=False),
    Run("gsm8k_adafuse_exact_b8", task="gsm8k", prompts="gsm8k"),
]
# Texts compared, example by example, over the examples both runs decoded.
SAME = [
    ("adafuse_exact_b8", "adafuse_exact_b1"),
    ("adafuse_exact_b8_warm", "adafuse_exact_b8"),
    ("adafuse_not_exact_b8", "adafuse_exact_b1"),
    ("adafuse_exact_b32", "adafuse_exact_b1"),
    ("adafuse_exact_b8_one_gpu", "adafuse_exact_b8"),
    ("single_llama_b8", "single_llama_b1"),
    ("single_mistral_b8", "single_mistral_b1"),
    ("generate_llama_b1", "single_llama_b1"),
    ("generate_mistral_b1", "single_mistral_b1"),
    ("gsm8k_adafuse_exact_b8", "gsm8k_adafuse_exact_b32"),
    ("gsm8k_adafuse_not_exact_b32", "gsm8k_adafuse_exact_b32"),
]
# Decode seconds over decode seconds (summed), each run whole.
RATIOS = {
    "adafuse_exact_b8_over_summed_generate_b1": (
        ["adafuse_exact_b8_warm"],
        ["generate_llama_b1", "generate_mistral_b1"],
    ),
    "first_adafuse_exact_b8_over_summed_generate_b1": (
        ["adafuse_exact_b8"],
        ["generate_llama_b1", "generate_mistral_b1"],
    ),
    "adafuse_exact_b8_over_exact_b1": (["adafuse_exact_b8_warm"], ["adafuse_exact_b1"]),
    "adafuse_exact_b8_over_not_exact_b8": (["adafuse_exact_b8_warm"], ["adafuse_not_exact_b8"]),
    "single_llama_b1_over_generate_llama_b1": (["single_llama_b1"], ["generate_llama_b1"]),
    "single_mistral_b1_over_generate_mistral_b1": (["single_mistral_b1"], ["generate_mistral_b1"]),
    "adafuse_exact_b8_one_gpu_over_two_gpus": (["adafuse_exact_b8_one_gpu"], ["adafuse_exact_b8_warm"]),
}


def check(
    out: Path,
    data_dir: Path,
    dry_run: bool = False,
    limit: float | None = None,
    layers: int | None = None,
    prompts: int | None = None,
    budget: int | None = None,
    work: Path | None = None,
    logs: Path | None = None,
) -> dict:
    """Every step, recorded to `out` as it ends (module docstring); the record. `work` holds the pair and the runs
    (default: a temporary folder, removed at the end); `logs` gets a copy of each child process's log (its run.py
    runs' logs among them)."""
    scale = scaled(DRY_RUN if dry_run else FULL, layers, prompts, budget)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() and not dry_run else 0
    keep = work is not None
    work = Path(work or tempfile.mkdtemp(prefix="adafuse-gpu-full-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    facts = {
        "dry_run": dry_run,
        "sizes": scale.sizes,
        "real_layers": REAL_LAYERS,
        "prompts": {name: {"limit": n, "max_new_tokens": b} for name, (n, b) in scale.prompts.items()},
        "limit_seconds": limit or scale.limit,
        "gpus": gpus,
        "plan": ["build", "ops", *(job.name for job in FIRST + WARM)],
    }
    record = StepRecord(out, limit or scale.limit, {"check": facts, "environment": environment()})
    context = Context(scale, data_dir.resolve(), work, gpus, record)
    try:
        context.prepare()
        context.decode()
        context.conclude()
    finally:
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            for log in work.glob("*.log"):
                shutil.copyfile(log, logs / f"gpu_full.{log.name}")
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return record.record


def scaled(scale: Scale, layers: int | None, prompts: int | None, budget: int | None) -> Scale:
    """`scale` with fewer layers at the same width, and other NQ prompts (twice as many at batch 32) or budget."""
    sizes = scale.sizes | ({"num_hidden_layers": layers} if layers else {})
    (nq, nq_budget), (nq_b32, _) = scale.prompts["nq"], scale.prompts["nq_b32"]
    if prompts:
        nq, nq_b32 = prompts, 2 * prompts
    nq_budget = budget or nq_budget
    sets = scale.prompts | {"nq": (nq, nq_budget), "nq_b32": (nq_b32, nq_budget)}
    return Scale(sizes, sets, scale.rows, scale.requests, scale.max_out_features, scale.shard_bytes, scale.limit)


class Context:
    """One check's state: where it writes, what each run decoded, and the record."""

    def __init__(self, scale: Scale, data_dir: Path, work: Path, gpus: int, record: StepRecord):
        self.scale, self.data_dir, self.work, self.gpus, self.record = scale, data_dir, work, gpus, record
        self.pair = work / "pair"
        self.built = False
        self.runs: dict[str, dict] = {}  # name -> its record
        self.texts: dict[str, dict[str, str]] = {}  # name -> {example id: text}
        self.device = "cuda" if gpus else "cpu"

    # -- the children ---------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """The pair written to disk, then the op report: in a process of their own, Triton's cache its own (so
        that the first run below still compiles its kernels as a user's first run does)."""
        jobs = [
            {
                "kind": "build",
                "name": "build",
                "out": str(self.pair),
                "names": list(NAMES),
                "sizes": self.scale.sizes,
                "device": self.device,
                "shard_bytes": self.scale.shard_bytes,
            },
            {
                "kind": "ops",
                "name": "ops",
                "pair": str(self.pair),
                "names": list(NAMES),
                "device": self.device,
                "rows": list(self.scale.rows),
                "requests": list(self.scale.requests),
                "max_out_features": self.scale.max_out_features,
            },
        ]
        # On the CPU the kernels run only interpreted, and Triton must know it from the process's start.
        interpret = {} if self.gpus else {"TRITON_INTERPRET": "1"}
        settings = {"TRITON_CACHE_DIR": str(self.work / "triton_ops")} | interpret
        for name, result in self.child("prepare", jobs, settings):
            self.built = self.built or (name == "build" and "models" in result)
            self.record.put(name, result)

    def decode(self) -> None:
        """The first process's runs, then the second's (module docstring)."""
        for label, runs in (("first", FIRST), ("warm", WARM)):
            jobs = []
            for run in runs:
                if not self.built:
                    self.put_run(run.name, {"skipped": "the pair was not built"})
                elif isinstance(run, Run) and run.one_gpu and self.gpus < 2:
                    self.put_run(run.name, {"skipped": f"{self.gpus or 'no'} GPU visible: the members share one"})
                else:
                    jobs.append(self.job(run))
            if not jobs:
                continue
            names = {job["name"]: job for job in jobs}
            settings = {
                "ADAFUSE_PROBE_STORE": str(self.work / "probe_store"),
                "TRITON_CACHE_DIR": str(self.work / "triton"),
            }
            for name, result in self.child(label, jobs, settings | {"HYDRA_FULL_ERROR": "1"}):
                self.put_run(name, self.read_run(names[name], result))

    def child(self, label: str, jobs: list[dict], settings: dict) -> Iterator[tuple[str, dict]]:
        """tools/gpu_runs.py over `jobs`, in the time left: each (name, record) as it ends (`child_records`). It runs
        in the work folder, this checkout first on its path (before an installed copy of the project)."""
        plan = self.work / f"{label}_plan.json"
        plan.write_text(json.dumps({"deadline": time.time() + self.record.left(), "jobs": jobs}))
        records = self.work / f"{label}_records.jsonl"
        command = [sys.executable, "-m", "tools.gpu_runs", str(plan), str(records)]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": path} | settings
        if not self.gpus:  # a dry run: every step on the CPU, run.py's `device: auto` included, GPU or not
            env["CUDA_VISIBLE_DEVICES"] = ""
        log = self.work / f"{label}.log"
        names = [job["name"] for job in jobs]
        yield from child_records(command, names, records, log, self.record.left(), env, cwd=self.work)

    def job(self, run: Run | Generate) -> dict:
        """What the child runs for `run`."""
        limit, budget = self.scale.prompts["nq" if isinstance(run, Generate) else run.prompts]
        if isinstance(run, Generate):
            device = f"cuda:{run.member % self.gpus}" if self.gpus else "cpu"  # where `device: auto` puts it
            path = self.pair / NAMES[run.member]
            return {"kind": "generate", "name": run.name, "path": str(path), "device": device, "task": "nq"} | {
                "limit": limit,
                "budget": budget,
                "data_dir": str(self.data_dir),
            }
        # The members' paths relative to the work folder, where the child runs: a run's id holds them (a path can
        # change a prediction), and its folder's name must stay within the 255 bytes a file name may have.
        pair = self.pair.relative_to(self.work)
        settings = overrides(run, pair, self.data_dir, self.work / "runs" / run.name, limit, budget)
        return {"kind": "run", "name": run.name, "overrides": settings, "profile": run.profile}

    # -- what came back -------------------------------------------------------------------------------------

    def read_run(self, job: dict, result: dict) -> dict:
        """A run's record: the child's (wall seconds, memory, profile) and what run.py wrote: metrics.json's
        decode seconds, batching, passes and scores; its texts kept apart for `identical`."""
        if job["kind"] == "generate":
            if "texts" in result:
                self.texts[job["name"]] = result.pop("texts")
            return result
        if "error" in result or "cut" in result or "skipped" in result:
            return result
        results = self.work / "runs" / job["name"]
        written = {path.name: path for path in results.rglob("*.json*")}
        if not {"metrics.json", "predictions.jsonl"} <= set(written):
            return result | {"error": f"run.py ended without writing metrics.json and predictions.jsonl in {results}"}
        metrics = json.loads(written["metrics.json"].read_text())
        predictions = written["predictions.jsonl"].read_text().splitlines()
        self.texts[job["name"]] = {r["id"]: r["prediction"] for r in map(json.loads, predictions)}
        models = metrics["runtime"]["models"]
        batching = metrics["batching"]
        read = {
            "examples": metrics["n"],
            "decode_seconds": metrics["throughput"]["seconds"],
            "batch_size": batching["batch_size"],
            "exact": batching["exact"],
            "batch_invariant": batching["batch_invariant"],
            "devices": {m["name"]: m["device"] for m in models},
            "passes": {m["name"]: m.get("passes") for m in models},
            "batching": batching["models"],
            "throughput": metrics["throughput"],
            "metrics": metrics["metrics"],
        }
        if "profile" in result:
            result["profile"]["per_pass"] = per_pass(result["profile"], read)
        return result | read

    def put_run(self, name: str, result: dict) -> None:
        self.runs[name] = result
        self.record.put("runs", self.runs)

    def conclude(self) -> None:
        runs = self.runs
        self.record.put("identical", identical(self.texts))
        self.record.put("ratios", ratios(runs))
        first, warm = runs.get("adafuse_exact_b8", {}), runs.get("gsm8k_adafuse_exact_b32", {})
        self.record.put(
            "probe_time",
            {
                "store_empty": probe_seconds(first),
                "store_warm": probe_seconds(warm),
                "first_run_wall_seconds": first.get("wall_seconds"),  # load, probes, compiles, decode
                "second_process_first_run_wall_seconds": warm.get("wall_seconds"),
            },
        )
        self.record.put("goals", goals(runs, self.record.record["identical"], self.record.record["ratios"]))


def overrides(run: Run, pair: Path, data_dir: Path, results: Path, limit: int, budget: int) -> list[str]:
    """run.py's command line for `run`: the paper's pair (conf/model_pair/llama_mistral.yaml) with the two folders
    as its members' paths, each run in a results folder of its own (results_dir changes no prediction)."""
    settings = [
        "model_pair=llama_mistral",
        *(f"model_pair.members.m{k}.path={pair / name}" for k, name in enumerate(NAMES)),
        f"task={run.task}",
        f"task.limit={limit}",
        f"task.max_new_tokens={budget}",
        f"method={run.method}",
        *([f"method.member={run.member}"] if run.member is not None else []),
        f"batch_size={run.batch_size}",
        f"batch_exact={str(run.exact).lower()}",
        f"data.dir={data_dir}",
        f"results_dir={results}",
        "wandb.mode=disabled",
        "progress=false",
    ]
    if run.one_gpu:
        settings += [f"model_pair.members.m{k}.device=cuda:0" for k in range(len(NAMES))]
    return settings


def child_records(
    command: list[str], names: list[str], records: Path, log: Path, seconds: float, env=None, cwd: Path = ROOT
) -> Iterator[tuple[str, dict]]:
    """Start `command`, a child that appends JSON lines to `records` ({"event": "start" or "end", "name": ...} and,
    at the end, the job's record), its output into `log`; yield (name, record) for each job of `names` as it
    ends. At `seconds` the child and its process group are stopped. Then each job that did not end: started, it
    is cut (at the deadline) or failed (the process died in it, the log's tail says how); never started, it is
    skipped, saying why."""
    started = time.perf_counter()
    with open(log, "ab") as output:
        child = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    begun: dict[str, float] = {}
    ended: set[str] = set()
    position, stopped = 0, False
    while True:
        finished = child.poll() is not None
        if not finished and time.perf_counter() - started > seconds:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            finished = stopped = True
        lines, position = new_lines(records, position)
        for line in lines:
            event = json.loads(line)
            name = event.pop("name")
            if event.pop("event") == "start":
                begun[name] = time.perf_counter()
            else:
                ended.add(name)
                yield name, event
        if finished:
            break
        time.sleep(0.2)
    for name in names:
        if name in ended:
            continue
        if name in begun and stopped:
            yield name, {"cut": f"stopped at the deadline after {time.perf_counter() - begun[name]:.0f} s"}
        elif name in begun:
            yield name, {"error": f"the process died in this job (status {child.returncode})", "log": tail(log)}
        elif stopped or child.returncode == 0:
            yield name, {"skipped": "out of time"}
        else:
            yield name, {"skipped": f"the process died before it (status {child.returncode})", "log": tail(log)}


def new_lines(path: Path, position: int) -> tuple[list[str], int]:
    """The whole lines written to `path` after byte `position`, and the position after them."""
    if not path.exists():
        return [], position
    with open(path, "rb") as f:
        f.seek(position)
        text = f.read()
    whole = text[: text.rfind(b"\n") + 1]
    return whole.decode().splitlines(), position + len(whole)


def tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


# ---- what the runs show -----------------------------------------------------------------------------------


def per_pass(profile: dict, run: dict) -> dict:
    """A profiled run's figures per pass of its models (every pass, alone and merged, of both): the decode's wall
    time, the host's share of it (all but the waits in synchronize calls), the GPU's busy time, and launches."""
    passes = sum(model["passes"] for model in run["batching"].values())
    decode = run["decode_seconds"]
    return {
        "passes": passes,
        "merged_passes": sum(model["merged_passes"] for model in run["batching"].values()),
        "wall_ms": 1000 * decode / max(passes, 1),
        "host_ms": 1000 * (decode - profile["sync_wait_seconds"]) / max(passes, 1),
        "gpu_ms": 1000 * profile["gpu_seconds"] / max(passes, 1),
        "launches": profile["launches"] / max(passes, 1),
        "kernels": profile["kernels"] / max(passes, 1),
    }


def identical(texts: dict[str, dict[str, str]]) -> dict:
    """Each pair of SAME: over the examples both decoded, how many texts are equal (None where either is missing)."""
    rows = {}
    for a, b in SAME:
        if a not in texts or b not in texts:
            rows[f"{a}_vs_{b}"] = None
            continue
        both = sorted(set(texts[a]) & set(texts[b]))
        rows[f"{a}_vs_{b}"] = {"examples": len(both), "texts": sum(texts[a][i] == texts[b][i] for i in both)}
    return rows


def ratios(runs: dict[str, dict]) -> dict:
    """Each of RATIOS over whole runs' decode seconds (None where a run is missing, cut, skipped or failed)."""

    def seconds(names: list[str]) -> float | None:
        found = [runs.get(name, {}).get("decode_seconds") for name in names]
        return None if None in found else sum(found)

    result = {}
    for name, (top, bottom) in RATIOS.items():
        a, b = seconds(top), seconds(bottom)
        result[name] = a / b if a is not None and b else None
    return result


def probe_seconds(run: dict) -> dict | None:
    """Each model's seconds choosing its kernels (the CUDA backend's probes, at its load), or None where the
    backend does not report them (the CPU's) or the run did not end."""
    passes = run.get("passes") or {}
    found = {name: p.get("probe_seconds") for name, p in passes.items() if p}
    return found if found and None not in found.values() else None


def goals(runs: dict[str, dict], same: dict, ratio: dict) -> dict:
    """Issue 50's three, each with what decides it and `met` (None where its runs did not end)."""
    b8 = runs.get("adafuse_exact_b8", {})
    texts = same.get("adafuse_exact_b8_vs_adafuse_exact_b1")
    if texts is None or "batch_invariant" not in b8:
        batch = {"met": None}
    else:
        equal = texts["texts"] == texts["examples"]
        batch = {"texts": f"{texts['texts']}/{texts['examples']}", "batch_invariant": b8["batch_invariant"]}
        batch["met"] = equal or not b8["batch_invariant"]  # equal, or the run says its outputs depend on the batch
    within = ratio.get("adafuse_exact_b8_over_summed_generate_b1")
    gsm8k = runs.get("gsm8k_adafuse_exact_b32", {})
    if "decode_seconds" in gsm8k:
        fits = True
    else:  # failed (the error says whether the GPU ran out of memory), or never ran to its end: not known
        fits = False if "error" in gsm8k else None
    return {
        "batch_8_texts_equal_batch_1_or_said_batch_dependent": batch,
        "adafuse_b8_at_most_summed_generate_b1": {"ratio": within, "met": None if within is None else within <= 1.0},
        "gsm8k_b32_without_running_out_of_memory": {
            "peak_gb": {gpu: m["peak_gb"] for gpu, m in gsm8k.get("memory", {}).items()},
            "error": gsm8k.get("error") or gsm8k.get("cut") or gsm8k.get("skipped"),
            "met": fits,
        },
    }
