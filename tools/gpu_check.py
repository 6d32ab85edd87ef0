"""The GPU check: what a user's run meets on one CUDA GPU, in one call of under 7 minutes on an H100, written to one
JSON stage by stage as each ends, the most important facts first (results/bench/gpu_check.json).

    python -m tools.gpu_check                      # on a machine with a CUDA GPU
    python -m tools.gpu_check --dry-run            # on a CPU: every stage at tiny sizes, the kernels interpreted
    python -m tools.gpu_check --layers 32 --logs logs   # the timing runs at 32 layers; the children's logs kept

Stages, each in a child process of its own (started, followed and stopped at its deadline from here), with its
seconds on an H100 (`GPU.budgets`; unused seconds pass to the timing runs):

1. `toolchain` (30 s): what Triton needs here (adafuse/backend/cuda/toolchain.py `problems`), gcc's version, the
   versions of Python, torch, CUDA, the driver, transformers and Triton, and one real launch of our log-softmax
   kernel (its seconds hold the first compile), checked against torch's.
2. `ops` (75 s): per op type at the paper pair's shapes in bfloat16 (linear, RMSNorm, log-softmax, attention), the
   stock kernel's and ours: the row counts (request counts) among which a row's bits differ from its bits alone,
   at the counts the engine reaches, and one call's milliseconds at a few; the backend's own probes
   (adafuse/backend/cuda/choice.py `rows_alone`, `requests_alone`).
3. `smoke` (105 s): the paper's pair in shape (tools/make_paper_pair.py: Llama-3.1-8B-Instruct and
   Mistral-7B-Instruct-v0.3 at their real width, tokenizers and hub configs, seeded random bfloat16 weights, in the
   hub's shards) at SMOKE_LAYERS layers, written to disk and decoded by `run.py model_pair=llama_mistral ...` as a
   user runs it, in a fresh process with the probe store and Triton's cache empty: AdaFuse exact at batch 8, then
   at batch 1, on NQ.
4. `timing` (the rest, about 190 s): the pair with as many layers as the time left allows (`layers`: how many, the
   estimate that chose them, or --layers), in a second process with the store and cache as the smoke left them,
   most telling first: AdaFuse exact at batch 8 on NQ; each member's transformers `generate()` at batch 1 on the
   same prompts; UniTE and SweetSpan at batch 8 (the paper's Figure 5: AdaFuse about as fast as UniTE); AdaFuse
   exact at batch 32 on GSM8K's 4-shot prompts (memory); AdaFuse exact at batch 1.
5. `identical`, `ratios` and `goals` (issue 56): batch 8's texts equal batch 1's, or the run says it is
   batch-dependent and why; AdaFuse at batch 8 within 1.0x the members' summed `generate()` at batch 1; AdaFuse
   within 1.1x UniTE; GSM8K's prompts at batch 32 within 80 GB (at fewer layers than 32, the peak extrapolated).

A job still going at its stage's deadline is stopped and recorded as `cut`, the jobs after it as `skipped`; a job
that fails keeps its exception's type, text and traceback, and a process that dies leaves its log's tail. Every
stage records its budget and its seconds under `stages`.
"""

import argparse
import gc
import json
import logging
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import torch.nn.functional as F

from eval.tasks import BESIDE_CHECKOUT as SHARED_DATA
from tools import make_paper_pair

ROOT = Path(__file__).resolve().parents[1]
NAMES = make_paper_pair.DEFAULT
SHORT = dict(zip(NAMES, ("llama", "mistral")))
REAL_LAYERS = 32
SMOKE_LAYERS = 2
MEMORY_GOAL_GB = 80


@dataclass(frozen=True)
class Scale:
    """What a check runs at."""

    sizes: dict  # both models' (the vocabularies are their own), at REAL_LAYERS layers
    smoke_layers: int
    max_layers: int  # the timing runs' at most
    prompts: dict[str, tuple[int, int]]  # task -> (task.limit, task.max_new_tokens)
    rows: tuple[int, ...]  # ops: rows in one call
    requests: tuple[int, ...]  # ops: requests in one attention call
    timed: tuple[int, ...]  # ops: the row (request) counts timed
    max_out_features: int | None  # ops: linear outputs probed at most (None: every one)
    shard_bytes: int  # the weight files' shards
    budgets: dict[str, float]  # seconds per stage; "timing" takes what is left of `limit`
    limit: float  # seconds for every stage together


GPU = Scale(
    sizes={
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": REAL_LAYERS,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    smoke_layers=SMOKE_LAYERS,
    max_layers=REAL_LAYERS,
    prompts={"nq": (8, 16), "gsm8k": (32, 16)},  # GSM8K: about 800-token prompts, for the memory they take
    # the row counts the engine's probes reach (choice.ROWS["cuda"]): a GSM8K step at batch 32 packs thousands
    rows=(1, 2, 3, 4, 5, 8, 16, 31, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    requests=(1, 2, 5, 16, 32),
    timed=(1, 8, 32, 256, 4096),
    max_out_features=None,
    shard_bytes=5 * 10**9,  # the hub's
    budgets={"toolchain": 30.0, "ops": 75.0, "smoke": 105.0},
    # the parent's own start and end, and the stages' process starts, fit in the 20 s left of 7 minutes
    limit=400.0,
)
DRY_RUN = Scale(
    sizes={
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": REAL_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
    },
    smoke_layers=1,
    max_layers=2,
    prompts={"nq": (2, 3), "gsm8k": (3, 3)},
    rows=(1, 2, 3, 8),
    requests=(1, 2, 5),
    timed=(1,),  # the interpreter's milliseconds tell nothing: one count, to run the timing's code
    max_out_features=1024,  # Triton's interpreter takes seconds for one multiply by a 128,256-row head
    shard_bytes=16 * 2**20,  # several shards, as at the real sizes
    budgets={"toolchain": 60.0, "ops": 120.0, "smoke": 120.0},
    limit=600.0,
)


@dataclass(frozen=True)
class Run:
    """One `python run.py model_pair=llama_mistral ...` of the check, or with `generate` one member's transformers
    `generate()` at batch 1 on the same prompts."""

    name: str
    method: str = "adafuse"
    task: str = "nq"
    batch_size: int = 8
    generate: int | None = None  # the member whose generate() runs instead of run.py


SMOKE = [Run("adafuse_exact_b8"), Run("adafuse_exact_b1", batch_size=1)]
TIMING = [
    Run("adafuse_exact_b8"),
    Run("generate_llama_b1", batch_size=1, generate=0),
    Run("generate_mistral_b1", batch_size=1, generate=1),
    Run("unite_b8", method="unite"),
    Run("sweetspan_b8", method="sweetspan"),
    Run("gsm8k_adafuse_exact_b32", task="gsm8k", batch_size=32),
    Run("adafuse_exact_b1", batch_size=1),
]
# The timing runs' decode seconds together, in units of AdaFuse exact at batch 8's first run on the same NQ prompts
# (the smoke's): how the timing stage's layers are chosen from the smoke (`choose_layers`). The dry run, where a
# pass is host-bound as on a GPU, measures about 2.5 (4.6 in units of the warm run); 6 leaves room for GSM8K's
# longer prompts, which weigh more where a pass's arithmetic counts.
TIMING_COST = 6.0
# Text pairs compared example by example, and decode-time ratios, per stage (the timing stage's names).
SAME = [("adafuse_exact_b8", "adafuse_exact_b1")]
RATIOS = {
    "adafuse_b8_over_summed_generate_b1": (["adafuse_exact_b8"], ["generate_llama_b1", "generate_mistral_b1"]),
    "adafuse_b8_over_unite_b8": (["adafuse_exact_b8"], ["unite_b8"]),
    "adafuse_b8_over_sweetspan_b8": (["adafuse_exact_b8"], ["sweetspan_b8"]),
    "adafuse_b8_over_b1": (["adafuse_exact_b8"], ["adafuse_exact_b1"]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every stage on a CPU at tiny sizes")
    parser.add_argument("--layers", type=int, help="the timing runs' layers (default: as many as the time allows)")
    parser.add_argument("--limit", type=float, help="seconds for every stage together (400; a dry run 600)")
    parser.add_argument("--data-dir", type=Path, default=SHARED_DATA)
    parser.add_argument("--out", type=Path, default=ROOT / "results/bench/gpu_check.json")
    parser.add_argument("--work", type=Path, help="where the pairs and the runs go, kept (default: a temporary folder)")
    parser.add_argument("--logs", type=Path, help="a folder for a copy of each stage's process log")
    parser.add_argument("--child", nargs=2, type=Path, metavar=("PLAN", "RECORDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run on a GPU machine, or use --dry-run to check the check")
    scale = DRY_RUN if args.dry_run else GPU
    if args.layers is not None and not 1 <= args.layers <= REAL_LAYERS:
        sys.exit(f"--layers must be between 1 and {REAL_LAYERS}, got {args.layers}")
    Check(scale, args.out, args.data_dir.resolve(), args.dry_run, args.limit, args.layers).run(args.work, args.logs)
    print(f"written to {args.out}")


# ---- the parent: stages, deadlines, the record --------------------------------------------------------------------


class Check:
    """One check's record, written again as each part of it ends, under one deadline."""

    def __init__(self, scale: Scale, out: Path, data_dir: Path, dry_run: bool, limit: float | None, layers: int | None):
        self.scale, self.out, self.data_dir, self.dry_run, self.layers = scale, out, data_dir, dry_run, layers
        self.started = time.perf_counter()
        self.deadline = self.started + (limit or scale.limit)
        self.texts: dict[str, dict[str, dict[str, str]]] = {"smoke": {}, "timing": {}}  # stage -> run -> id -> text
        self.record = {
            "check": {
                "dry_run": dry_run,
                "sizes": scale.sizes,
                "real_layers": REAL_LAYERS,
                "prompts": {task: {"limit": n, "max_new_tokens": b} for task, (n, b) in scale.prompts.items()},
                "limit_seconds": limit or scale.limit,
                "plan": {"smoke": [r.name for r in SMOKE], "timing": [r.name for r in TIMING]},
            },
            "stages": {},
        }
        out.parent.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, value) -> None:
        self.record[key] = value
        self.out.write_text(json.dumps(self.record, indent=2) + "\n")

    def run(self, work: Path | None, logs: Path | None) -> dict:
        keep = work is not None
        self.work = Path(work or tempfile.mkdtemp(prefix="adafuse-gpu-check-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            self.stages()
        finally:
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                for log in self.work.glob("*.log"):
                    shutil.copyfile(log, logs / f"gpu_check.{log.name}")
            if not keep:
                shutil.rmtree(self.work, ignore_errors=True)
        return self.record

    def stages(self) -> None:
        device = "cpu" if self.dry_run else "cuda"
        interpret = {"TRITON_INTERPRET": "1"} if self.dry_run else {}  # on a CPU the kernels run only interpreted
        sizes, scale = self.scale.sizes, self.scale
        self.stage("toolchain", [{"kind": "toolchain", "name": "toolchain", "device": device}], interpret)
        ops = {"kind": "ops", "name": "ops", "device": device, "sizes": sizes, "rows": scale.rows}
        ops |= {"requests": scale.requests, "timed": scale.timed, "max_out_features": scale.max_out_features}
        self.stage("ops", [ops], interpret | {"TRITON_CACHE_DIR": str(self.work / "triton_ops")})
        # a user's first run: the probe store and Triton's cache empty, each its own to the stages below
        warm = {"ADAFUSE_PROBE_STORE": str(self.work / "probe_store"), "TRITON_CACHE_DIR": str(self.work / "triton")}
        smoke_pair = self.work / f"pair_{scale.smoke_layers}"
        jobs = [self.build(smoke_pair, scale.smoke_layers, device), *(self.job(r, smoke_pair) for r in SMOKE)]
        self.stage("smoke", jobs, warm)
        layers = self.choose_layers()
        pair = self.work / f"pair_{layers}"
        built = [] if pair == smoke_pair else [self.build(pair, layers, device)]
        self.stage("timing", built + [self.job(r, pair) for r in TIMING], warm)
        self.conclude()

    def build(self, pair: Path, layers: int, device: str) -> dict:
        sizes = self.scale.sizes | {"num_hidden_layers": layers}
        return {"kind": "build", "name": "build", "out": str(pair), "sizes": sizes, "device": device} | {
            "shard_bytes": self.scale.shard_bytes
        }

    def job(self, run: Run, pair: Path) -> dict:
        limit, budget = self.scale.prompts[run.task]
        task = {"task": run.task, "limit": limit, "budget": budget, "data_dir": str(self.data_dir)}
        if run.generate is not None:
            path = str(pair / NAMES[run.generate])
            return {"kind": "generate", "name": run.name, "path": path, "device": self.device(run.generate)} | task
        # The members' paths relative to the work folder, where the child runs: a run's id holds them (a path can
        # change a prediction), and its folder's name must stay within the 255 bytes a file name may have.
        results = self.work / "runs" / pair.name / run.name
        settings = overrides(run, pair.relative_to(self.work), task, results)
        return {"kind": "run", "name": run.name, "overrides": settings, "results": results}

    def device(self, member: int) -> str:
        """Where run.py's `device: auto` puts member k: the k-th GPU, modulo the GPUs there are."""
        return f"cuda:{member % torch.cuda.device_count()}" if not self.dry_run else "cpu"

    def stage(self, name: str, jobs: list[dict], settings: dict) -> None:
        """Run `jobs` in a child process until the stage's deadline (its budget, or for the last stage, the check's),
        each job's record put under the job's name as it ends (`toolchain` and `ops` at the top, runs under their
        stage's name), the stage's budget and seconds under `stages`."""
        started = time.perf_counter()
        budget = self.scale.budgets.get(name, self.deadline - started)
        seconds = min(budget, self.deadline - started)
        found = {}
        for job, result in self.follow(name, jobs, seconds, settings):
            if "texts" in result:
                self.texts[name][job] = result.pop("texts")
            if name in ("toolchain", "ops"):
                self.put(name, result)
            else:
                found[job] = result
                self.put(name, found)
        times = {"budget_seconds": round(budget, 1), "seconds": round(time.perf_counter() - started, 1)}
        self.record["stages"][name] = times
        self.put("stages", self.record["stages"])

    def follow(self, name: str, jobs: list[dict], seconds: float, settings: dict) -> Iterator[tuple[str, dict]]:
        """This module as a child process over `jobs` (`child`), in this checkout, for `seconds` at most."""
        plan = self.work / f"{name}_plan.json"
        plan.write_text(json.dumps({"deadline": time.time() + seconds, "jobs": jobs}, default=str))
        command = [sys.executable, "-m", "tools.gpu_check", "--child", str(plan), str(self.work / f"{name}.jsonl")]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": path, "HYDRA_FULL_ERROR": "1"} | settings
        if self.dry_run:  # every stage on the CPU, run.py's `device: auto` included, GPU or not
            env["CUDA_VISIBLE_DEVICES"] = ""
        names = [job["name"] for job in jobs]
        log = self.work / f"{name}.log"
        yield from child_records(command, names, self.work / f"{name}.jsonl", log, seconds, env, cwd=self.work)

    def choose_layers(self) -> int:
        """The timing runs' layers: --layers, else the most (up to the scale's) whose estimated stage fits the time
        left (`estimate`), recorded with its figures under `layers`."""
        smoke, scale = self.record.get("smoke", {}), self.scale
        left = self.deadline - time.perf_counter()
        if self.layers is not None:
            chosen = {"layers": self.layers, "why": "--layers"}
        elif "models" not in smoke.get("build", {}) or "decode_seconds" not in smoke.get("adafuse_exact_b8", {}):
            chosen = {"layers": scale.smoke_layers, "why": "the smoke run did not decode: nothing to estimate from"}
        else:
            costs = {n: estimate(smoke, n, scale.smoke_layers) for n in range(1, scale.max_layers + 1)}
            fits = [n for n, cost in costs.items() if cost["seconds"] <= 0.85 * left]  # a margin for the estimate
            layers = max(fits, default=scale.smoke_layers)
            why = f"the most of {scale.max_layers} whose estimate fits 85% of the {left:.0f} s left"
            chosen = {"layers": layers, "why": why if fits else "none fits the time left: the smoke pair again"}
            chosen["estimate"] = costs[layers]
        self.put("layers", chosen | {"seconds_left": round(left, 1)})
        return chosen["layers"]

    def conclude(self) -> None:
        timing, smoke = self.record.get("timing", {}), self.record.get("smoke", {})
        same = {stage: identical(self.texts[stage]) for stage in ("smoke", "timing")}
        ratio = ratios(timing)
        self.put("identical", same)
        self.put("ratios", ratio)
        pair = timing.get("build") or smoke.get("build")  # the timing runs' pair: the smoke's where not built again
        self.put("goals", goals(smoke, timing, same, ratio, pair))


def overrides(run: Run, pair: Path, task: dict, results: Path) -> list[str]:
    """run.py's command line for `run`: the paper's pair (conf/model_pair/llama_mistral.yaml) with the two folders as
    its members' paths, exact batching, each run in a results folder of its own (which changes no prediction)."""
    return [
        "model_pair=llama_mistral",
        *(f"model_pair.members.m{k}.path={pair / name}" for k, name in enumerate(NAMES)),
        f"task={run.task}",
        f"task.limit={task['limit']}",
        f"task.max_new_tokens={task['budget']}",
        f"method={run.method}",
        f"batch_size={run.batch_size}",
        "batch_exact=true",
        f"data.dir={task['data_dir']}",
        f"results_dir={results}",
        "wandb.mode=disabled",
        "progress=false",
    ]


def estimate(smoke: dict, layers: int, smoke_layers: int) -> dict:
    """The timing stage's seconds at `layers`, from the smoke stage's figures, each taken as growing with the layers:
    writing the pair (the smoke pair's seconds per byte), loading it twice (the run's and `generate()`'s: the smoke
    run's wall seconds beside its decode and its probes, per byte) and the decode (the smoke's
    AdaFuse at batch 8 per layer, TIMING_COST times). An overestimate: a pass's vocabulary projection, log-softmax
    and the method's own work do not grow with the layers."""
    build, first = smoke["build"], smoke["adafuse_exact_b8"]
    smoke_bytes = sum(m["bytes"] for m in build["models"].values())
    write = sum(m["seconds"] for m in build["models"].values()) / smoke_bytes
    probes = sum(p.get("probe_seconds", 0.0) for p in first["passes"].values() if p)  # compiling too: not per byte
    load = (first["wall_seconds"] - first["decode_seconds"] - probes) / smoke_bytes
    per_layer = sum(m["layer_bytes"] for m in build["models"].values())
    pair_bytes = smoke_bytes + (layers - smoke_layers) * per_layer
    decode = TIMING_COST * first["decode_seconds"] * layers / smoke_layers
    seconds = pair_bytes * (write + 2 * load) + decode
    return {"seconds": round(seconds, 1), "decode_seconds": round(decode, 1), "pair_gb": round(pair_bytes / 1e9, 2)}


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


# ---- what the runs show -------------------------------------------------------------------------------------------


def identical(texts: dict[str, dict[str, str]]) -> dict:
    """Each pair of SAME: over the examples both decoded, how many texts are equal (None where either is missing)."""
    rows = {}
    for a, b in SAME:
        both = sorted(set(texts[a]) & set(texts[b])) if a in texts and b in texts else None
        rows[f"{a}_vs_{b}"] = both and {"examples": len(both), "texts": sum(texts[a][i] == texts[b][i] for i in both)}
    return rows


def ratios(runs: dict[str, dict]) -> dict:
    """Each of RATIOS over whole runs' decode seconds (None where a run is missing, cut, skipped or failed)."""

    def seconds(names: list[str]) -> float | None:
        found = [runs.get(name, {}).get("decode_seconds") for name in names]
        return None if None in found else sum(found)

    result = {}
    for name, (top, bottom) in RATIOS.items():
        a, b = seconds(top), seconds(bottom)
        result[name] = round(a / b, 3) if a is not None and b else None
    return result


def goals(smoke: dict, timing: dict, same: dict, ratio: dict, pair: dict) -> dict:
    """Issue 56's four, each with what decides it and `met` (None where its runs did not end)."""
    batch = {stage: batch_goal(runs, same[stage]) for stage, runs in (("smoke", smoke), ("timing", timing))}
    known = [b["met"] for b in batch.values() if b["met"] is not None]
    batch["met"] = all(known) if known else None

    def at_most(name: str, limit: float) -> dict:
        value = ratio.get(name)
        return {"ratio": value, "at_most": limit, "met": None if value is None else value <= limit}

    return {
        "batch_8_texts_equal_batch_1_or_said_batch_dependent": batch,
        "adafuse_b8_at_most_summed_generate_b1": at_most("adafuse_b8_over_summed_generate_b1", 1.0),
        "adafuse_b8_at_most_1.1_unite_b8": at_most("adafuse_b8_over_unite_b8", 1.1),
        "gsm8k_b32_within_80_gb": memory_goal(timing.get("gsm8k_adafuse_exact_b32", {}), pair),
    }


def batch_goal(runs: dict, same: dict | None) -> dict:
    """Batch 8's texts against batch 1's in one stage: met where equal, or where the batch-8 run says its outputs
    depend on the batch (then why: each model's failing op types, probe errors and missing toolchain)."""
    b8 = runs.get("adafuse_exact_b8", {})
    texts = same and same.get("adafuse_exact_b8_vs_adafuse_exact_b1")
    if not texts or "batch_invariant" not in b8:
        return {"met": None}
    found = {"texts": f"{texts['texts']}/{texts['examples']}", "batch_invariant": b8["batch_invariant"]}
    if not b8["batch_invariant"]:
        keys = ("backend", "failing", "probe_errors", "toolchain")
        found["why"] = {name: {k: p.get(k) for k in keys} for name, p in b8["passes"].items() if p}
    return found | {"met": texts["texts"] == texts["examples"] or not b8["batch_invariant"]}


def memory_goal(run: dict, pair: dict) -> dict:
    """GSM8K at batch 32: the most memory reserved on any GPU and, for a pair of fewer layers than the real ones
    (`pair`: its build's record), that peak grown to REAL_LAYERS: the weights by the layers' bytes, the rest of
    the peak (the KV cache, activations) by the layers' ratio. Met where within MEMORY_GOAL_GB."""
    if "decode_seconds" not in run:  # failed (its error says whether the GPU ran out of memory), or did not end
        why = run.get("error") or run.get("cut") or run.get("skipped")
        return {"error": why, "met": False if "error" in run else None}
    peak = max((m["peak_reserved_gb"] for m in run["memory"].values()), default=None)
    if peak is None:
        return {"peak_gb": None, "met": None, "why": "no GPU: nothing to measure"}  # a dry run
    models = pair["models"].values()
    layers = next(iter(models))["layers"]
    weights = sum(m["bytes"] for m in models) / 2**30
    more = (REAL_LAYERS - layers) * sum(m["layer_bytes"] for m in models) / 2**30
    grown = weights + more + (peak - weights) * REAL_LAYERS / layers
    found = {"peak_gb": round(peak, 2), "layers": layers, "at_real_layers_gb": round(grown, 2)}
    return found | {"met": grown <= MEMORY_GOAL_GB}


# ---- the child: the jobs of one stage, one after another ---------------------------------------------------------


def child(plan_file: Path, records: Path) -> None:
    """Run a stage's jobs, each written to `records` as a JSON line when it starts and when it ends (its record, with
    its wall seconds and each visible GPU's memory), so that the parent, which stops this process at its deadline,
    keeps every job that ended and knows which one it cut. A job that raises is recorded; the next one still runs."""
    plan = json.loads(plan_file.read_text())
    for job in plan["jobs"]:
        if time.time() > plan["deadline"]:
            return
        write(records, {"event": "start", "name": job["name"]})
        peaks = GpuPeaks()
        started = time.perf_counter()
        try:
            record = JOBS[job["kind"]](job)
        except Exception as err:  # recorded with its text; the next job still runs
            record = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        record |= {"wall_seconds": round(time.perf_counter() - started, 2), "memory": peaks.read()}
        write(records, {"event": "end", "name": job["name"], **record})
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # what a job let go (a bare model after `generate`) is not the next one's


def write(records: Path, line: dict) -> None:
    with open(records, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


class GpuPeaks:
    """Each visible GPU's memory over a job: allocated at its start, and the most allocated and reserved in it
    (torch's allocator counts per process: only the process that ran a job can say what it took)."""

    def __init__(self):
        self.devices = range(torch.cuda.device_count()) if torch.cuda.is_available() else range(0)
        self.start = {}
        for d in self.devices:
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
            self.start[d] = torch.cuda.memory_allocated(d)

    def read(self) -> dict:
        figures = {}
        for d in self.devices:
            torch.cuda.synchronize(d)
            figures[f"cuda:{d}"] = {
                "start_gb": round(self.start[d] / 2**30, 2),
                "peak_gb": round(torch.cuda.max_memory_allocated(d) / 2**30, 2),
                "peak_reserved_gb": round(torch.cuda.max_memory_reserved(d) / 2**30, 2),
            }
        return figures


def toolchain(job: dict) -> dict:
    """Versions, what Triton lacks here, and one real launch of a kernel (on a CPU, under the interpreter)."""
    import transformers

    from adafuse.backend.cuda import toolchain as triton_needs

    cuda = torch.cuda.is_available()
    found = {
        "problems": triton_needs.problems(),
        "gcc": first_line(["gcc", "--version"]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if cuda else None,
        "transformers": transformers.__version__,
        "triton": installed("triton"),
        "gpus": [
            {
                "name": torch.cuda.get_device_name(d),
                "memory_gb": torch.cuda.get_device_properties(d).total_memory / 2**30,
            }
            for d in range(torch.cuda.device_count() if cuda else 0)
        ],
    }
    try:
        found["launch"] = launch(torch.device(job["device"]))
    except Exception as err:  # what stops the launch (no compiler, no Python.h, no cache) is the finding
        found["launch"] = {"error": f"{type(err).__name__}: {err}"}
    return found


def launch(device: torch.device) -> dict:
    """One launch of our log-softmax kernel (compiled on a GPU, its seconds holding the compile), against torch's."""
    from adafuse.backend.cuda import kernels

    x = torch.randn(4, 1000, device=device)
    started = time.perf_counter()
    ours = kernels.log_softmax(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    agrees = torch.allclose(ours, torch.log_softmax(x, -1), atol=1e-5, rtol=1e-5)
    return {
        "kernel": "log_softmax",
        "seconds": round(seconds, 2),
        "interpreted": kernels.interpreting(),
        "agrees": agrees,
    }


def first_line(command: list[str]) -> str | None:
    """The first line a program prints, or None where it is not here or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout else None


def installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def ops(job: dict) -> dict:
    """Per op type at the pair's shapes (`pair_shapes`), in bfloat16 on the job's device: {"stock": finding,
    "kernel": finding}, each the backend's probe's (`attempt`). The linear layers' weights and the rows are the
    probes' own (choice.py `probe_rows`: mixed magnitudes, whose sums round differently in another order)."""
    from adafuse.backend.cuda import kernels, layers
    from adafuse.backend.cuda.attention import torch_varlen
    from adafuse.backend.cuda.choice import kernel_attention, probe_rows, requests_alone, rows_alone

    like = torch.empty(0, dtype=torch.bfloat16, device=torch.device(job["device"]))
    rows, requests, timed = job["rows"], job["requests"], job["timed"]
    shapes = pair_shapes(job["sizes"])

    def both(probe, stock, kernel, *args, counts) -> dict:
        at = {"counts": counts, "timed": [n for n in timed if n <= max(counts)]}
        return {"stock": attempt(probe, stock, *args, like, **at), "kernel": attempt(probe, kernel, *args, like, **at)}

    linear = {}
    for out_features, in_features in shapes["linear"]:
        out_features = min(out_features, job["max_out_features"] or out_features)
        w = probe_rows(out_features, in_features, like, seed=1)
        stock, ours = (lambda x, w=w: F.linear(x, w)), (lambda x, w=w: kernels.linear(x, w))
        linear[f"{out_features}x{in_features}"] = both(rows_alone, stock, ours, in_features, counts=rows)
    norms = {}
    for cls, hidden, eps in shapes["rms_norm"]:
        norm = layers.kernel_norm(cls)(hidden, eps=eps).to(like)  # the backend's kernel-aware norm of this class
        with torch.no_grad():
            norm.weight.copy_(probe_rows(1, hidden, like, seed=2)[0])
        stock, ours = (lambda x, n=norm, c=cls: c.forward(n, x)), (lambda x, n=norm: layers.norm_kernel(n, x))
        norms[f"{cls.__name__} {hidden}"] = both(rows_alone, stock, ours, hidden, counts=rows)
    softmax = {}
    for vocab in shapes["vocab"]:  # on the float32 logits a read's log-softmax takes
        stock, ours = (lambda x: torch.log_softmax(x.float(), -1)), (lambda x: kernels.log_softmax(x.float()))
        softmax[str(vocab)] = both(rows_alone, stock, ours, vocab, counts=rows)
    heads = shapes["attention"]
    attention = {
        "x".join(map(str, heads)): both(requests_alone, torch_varlen(), kernel_attention, *heads, counts=requests)
    }
    return {
        "device": str(like.device),
        "dtype": "bfloat16",
        "kernels_interpreted": kernels.interpreting(),
        "linear": linear,
        "rms_norm": norms,
        "log_softmax": softmax,
        "attention": attention,
    }


def pair_shapes(sizes: dict) -> dict:
    """The pair's op shapes at `sizes`, from its configs through models made on the meta device (no memory): every
    linear layer's weight (out, in), every RMSNorm class with its width and epsilon, the vocabularies, and the
    attention's (heads, key/value heads, head size), the same in both models."""
    linear, norms, vocab, heads = set(), set(), [], set()
    for name in NAMES:
        model = meta_model(name, sizes)
        config = model.config
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                linear.add(tuple(module.weight.shape))
            elif type(module).__name__.endswith("RMSNorm"):
                norms.add((type(module), module.weight.shape[0], module.variance_epsilon))
        vocab.append(config.vocab_size)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        heads.add((config.num_attention_heads, config.num_key_value_heads, head_dim))
    (attention,) = heads
    return {"linear": sorted(linear), "rms_norm": sorted(norms, key=str), "vocab": vocab, "attention": attention}


def meta_model(name: str, sizes: dict):
    """The model of make_paper_pair's config for `name` at `sizes`, on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(make_paper_pair.SHAPES[name]["config"](sizes)[0])
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config))


def attempt(probe, op, *args, **kwargs) -> dict:
    """`probe(op, *args, **kwargs)`'s finding ({"keeps_bits", "differs_at", "ms"}), or what stopped it: an op that
    cannot run here (torch's varlen kernel off CUDA or missing from this torch, a kernel this Triton cannot
    compile) is a finding, and the other ops still run."""
    if op is None:
        return {"error": "not in this torch"}
    try:
        found = probe(op, *args, **kwargs)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"}
    ms = {str(n): round(t, 4) for n, t in found.ms.items()}
    return {"keeps_bits": found.keeps_bits, "differs_at": found.differs_at, "ms": ms}


def build(job: dict) -> dict:
    """Each model of the pair written to job["out"]/<name> in bfloat16, its weights made on the job's device; per
    model its seconds, bytes and one layer's bytes (what a layer more or less costs), layers and vocabulary."""
    from safetensors import safe_open

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    models = {}
    for name in NAMES:
        started = time.perf_counter()
        folder = make_paper_pair.build(name, out, job["sizes"], job["device"], torch.bfloat16, job["shard_bytes"])
        files = sorted(folder.glob("*.safetensors"))
        layer_bytes = 0
        for file in files:
            with safe_open(file, "pt") as weights:
                for key in weights.keys():
                    if ".layers.0." in key:
                        layer_bytes += 2 * math.prod(weights.get_slice(key).get_shape())  # bfloat16
        config = json.loads((folder / "config.json").read_text())
        models[name] = {
            "seconds": round(time.perf_counter() - started, 2),
            "bytes": sum(f.stat().st_size for f in files),
            "layer_bytes": layer_bytes,
            "files": len(files),
            "layers": config["num_hidden_layers"],
            "vocab": config["vocab_size"],
        }
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"folder": str(out), "models": models}


class Refusal(logging.Handler):
    """The lines run.py logs as it refuses a run (run.py `refuse`: a bad input's one line, then exit status 2)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run(job: dict) -> dict:
    """run.py's Hydra entry point on the job's overrides, in this process, as a `python run.py -m` sweep runs its
    jobs (the runner keeps the models it loaded for the next run: eval/runner.py `load_ensemble`). An exception
    reaches the job's record with its text (HYDRA_FULL_ERROR=1), a refusal with its line. Then what run.py wrote."""
    import run as run_py  # run.py, at the checkout's root

    refusal, argv = Refusal(), sys.argv
    logging.getLogger("run").addHandler(refusal)
    sys.argv = ["run.py", *job["overrides"]]
    try:
        run_py.cli()
    except SystemExit as exit:
        if exit.code:
            raise RuntimeError(f"run.py refused the run (status {exit.code}): {' '.join(refusal.lines)}") from None
    finally:
        sys.argv = argv
        logging.getLogger("run").removeHandler(refusal)
    return read_run(Path(job["results"]))


def read_run(results: Path) -> dict:
    """A finished run's figures from its metrics.json and its texts from predictions.jsonl: examples, decode seconds,
    whether its outputs are batch-invariant, per model how its passes ran (the backend's record: kernels, probe
    verdicts, errors and seconds) and met (passes, merged, rows, GPU and host seconds, KV at peak)."""
    written = {path.name: path for path in results.rglob("*.json*")}
    if not {"metrics.json", "predictions.jsonl"} <= set(written):
        raise RuntimeError(f"run.py ended without writing metrics.json and predictions.jsonl in {results}")
    metrics = json.loads(written["metrics.json"].read_text())
    predictions = map(json.loads, written["predictions.jsonl"].read_text().splitlines())
    models = metrics["runtime"]["models"]
    return {
        "examples": metrics["n"],
        "decode_seconds": metrics["throughput"]["seconds"],
        "batch_invariant": metrics["batching"]["batch_invariant"],
        "passes": {m["name"]: m.get("passes") for m in models},
        "batching": metrics["batching"]["models"],
        "texts": {r["id"]: r["prediction"] for r in predictions},
    }


def generate(job: dict) -> dict:
    """transformers' greedy `generate()` over each prompt alone: the model loaded as a member loads (bfloat16,
    straight onto its device), its stop strings in one criterion built once, a warm-up of two tokens timed apart,
    then every prompt timed, the device synchronised at both ends. Texts cut before the first stop string, as a
    run's predictions are, by example id."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList, StopStringCriteria

    from conf.compose import compose_run
    from conf.schema import DataConf
    from eval.tasks import Task

    device = torch.device(job["device"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(job["path"])
    model = AutoModelForCausalLM.from_pretrained(job["path"], dtype=torch.bfloat16, device_map={"": device}).eval()
    load_seconds = time.perf_counter() - started
    cfg = OmegaConf.to_object(compose_run(f"task={job['task']}", f"task.limit={job['limit']}").task)
    task = Task(cfg, DataConf(dir=job["data_dir"]))
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer, list(cfg.stop))])

    def greedy(prompt: str, budget: int) -> tuple[str, int]:
        ids = tokenizer(prompt, return_tensors="pt").to(device)
        with torch.inference_mode():
            out = model.generate(
                **ids,
                max_new_tokens=budget,
                do_sample=False,
                stopping_criteria=stop,
                pad_token_id=tokenizer.eos_token_id,
            )
        new = out[0, ids.input_ids.shape[1] :]
        text = tokenizer.decode(new, skip_special_tokens=True)
        return text[: min((text.find(s) for s in cfg.stop if s in text), default=len(text))], len(new)

    prompts = {ex.id: task.prompt(ex) for ex in task.examples}
    started = time.perf_counter()
    greedy(next(iter(prompts.values())), 2)
    sync()
    warm_up = time.perf_counter() - started
    texts, tokens = {}, 0
    started = time.perf_counter()
    for example, prompt in prompts.items():
        texts[example], new = greedy(prompt, job["budget"])
        tokens += new
    sync()
    seconds = time.perf_counter() - started
    return {
        "load_seconds": round(load_seconds, 2),
        "warm_up_seconds": round(warm_up, 2),
        "decode_seconds": seconds,
        "examples": len(texts),
        "new_tokens": tokens,
        "ms_per_token": round(1000 * seconds / max(tokens, 1), 2),
        "device": str(device),
        "texts": texts,
    }


JOBS = {"toolchain": toolchain, "ops": ops, "build": build, "run": run, "generate": generate}

if __name__ == "__main__":
    main()
