"""Decoding speed, measured side by side in one run on the bundled pair (SmolLM2-135M + Gemma-3-270M).

    python -m tools.bench_decode                 # about 15 minutes on 2 CPU cores
    python -m tools.bench_decode --quick         # a smaller smoke version

1. AdaFuse against the two models' greedy (`single`) decoding on the same real benchmark prompts
   (../shared/data), interleaved prompt by prompt so that machine drift hits all three alike:
   wall time ratio AdaFuse / (single A + single B), forward passes per round, tokens fed per
   generated token per model; AdaFuse with B = 1 (no branching) alongside, to show what B = 3 costs.
2. The fast decoder against the cache-free reference (oracles/reference.py) on few-shot
   prompts of 500+ tokens: identical output, and the speed-up.
3. Batching across examples (adafuse/engine/loop.py): AdaFuse and `single` at batch sizes 1, 4, 8, 16
   on the same 48 benchmark prompts: throughput (examples per second), the AdaFuse cost per example
   against the two members' unbatched greedy decoding, outputs identical to batch size 1, and the
   peak memory of each run.
4. `--only authors --authors-code PATH`: the authors' released decoder (a checkout of CCM0111/AdaFuse,
   run unmodified through tools/authors_code.py) against our `method=adafuse_code`, on the same NQ
   questions of their test file with their prompt, interleaved question by question with our `adafuse`
   and the two single models: wall time per example, the speed-up over their code (goal >= 10x), and
   their `pred` against ours (identical).
5. `--only projection`: each bundled model's vocabulary projection, multiplied in blocks of its weight's
   rows (adafuse/backend/cpu/projection.py) against one F.linear, interleaved, for 1-64 rows: time, and identical bits
   to one F.linear of the rows padded to the blocks' row tiles (the canonical multiply).
6. `--only lm_eval`: the same 48 NQ prompts decoded by AdaFuse through lm-evaluation-harness
   (`simple_evaluate` with our `adafuse` model and the task eval/lm_tasks.py writes) and as the runner
   decodes them (`Ensemble.decode_stream`), at the same batch size, alternating which goes first: wall
   time of each, the ratio (goal <= 1.10), and identical texts.
7. `--only exact`: what exact batching costs (adafuse/backend/cpu/tiles.py): AdaFuse on the same 48 prompts of
   one task (`--batching-task`, default NQ; `--limit` fewer) exact at batch 8, not exact at batch 8 and
   exact at batch 1, in one run: the three throughputs and whether the outputs are identical.
8. `--only default_run`: the user's measure of the ensemble's cost. `python run.py` with every default
   (AdaFuse on the bundled pair, 50 NQ questions, batch 8, exact) and each member alone
   (`method=single method.member=K`), each in a fresh process, alternating `--repeats` times: decode
   seconds from each run's metrics.json, AdaFuse / (member 0 + member 1), and predictions against the
   committed results/grid runs. A fourth run, `batch_side_by_side=false`, runs AdaFuse's passes one model
   after the other, each on every core: each model's pass seconds there are what its passes cost with
   nothing beside them; the slower model's and both models', over the members' sum, bracket what
   running them side by side can reach (`passes_alone_over_members`).
9. `--only overhead`: the engine's host time per pass, on the paper's pair in shape at its test size, where
   a pass's arithmetic is small: each member's transformers `generate()` at batch 1 against `single` at
   batch 1 and 8 and AdaFuse exact at batch 1 and 8 (tools/bench_overhead.py).
10. `--only serve`: `adafuse-serve` against offline decoding, on the same NQ prompts (`--limit`, 48) at 1, 8
   and 32 concurrent clients: throughput, latency p50/p95, the server's wall time over `decode_stream`'s at
   the same batch size (goal at 8 clients: <= 1.10), identical texts (tools/bench_serve.py).
11. `--only memory`: what a batch holds. `python run.py task=gsm8k task.limit=8` (4-shot prompts of about 800
   tokens) at batch 8 and at batch 1, each a fresh process: each run's peak resident memory (the process's own,
   from wait4), its models' KV bytes (metrics.json `batching`: the most held, the most per example in flight, the
   stored prompt prefixes, and one context's, KV per token times the longest context), and its predictions
   against the other run and the committed results/grid run.
12. `--only host`: the engine's host time per pass at the paper pair's real depth (32 layers, 32/8 heads) and a tiny
   width: one merged pass of 1, 8 and 32 requests against one plain transformers forward, AdaFuse exact at batch 8
   against the members' summed `generate()`, and the KV bytes the engine copies per pass (tools/bench_host.py); the
   same through the CUDA backend's code with its kernels stood in for, the host's work for a pass on a GPU.
Prints a table and writes the figures to results/bench/decode.json; `--only reference`, `authors`,
`projection`, `lm_eval`, `exact`, `default_run`, `overhead`, `serve`, `memory` or `host` writes its section alone
to reference.json, authors.json, projection.json, lm_eval.json, exact_batching.json, default_run.json,
overhead.json, serve.json, memory.json or host.json.
"""

import argparse
import ctypes
import ctypes.util
import functools
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import psutil
import torch
import torch.nn.functional as F

from adafuse import AdaFuseConfig, Ensemble
from adafuse.backend import backend_for
from adafuse.backend.cpu.projection import BLOCK_ROWS
from adafuse.backend.cpu.tiles import pad_to_tiles
from adafuse.engine.executor import Executor
from adafuse.engine.loop import decode_many, drive
from adafuse.ensemble import resolve_method
from adafuse.methods import METHODS
from adafuse.methods.session import Request
from conf.compose import compose_run
from conf.schema import DataConf
from eval.results import read_predictions
from eval.tasks import BESIDE_CHECKOUT, Task
from oracles import reference
from tools.bench_host import compare_host
from tools.bench_overhead import compare_overhead
from tools.bench_serve import compare_serve

ROOT = Path(__file__).resolve().parent.parent

LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if sys.platform == "linux" else None

# (task, prompts, token budget): real prompts, as the harness builds them.
SUITE = [("nq", 8, 32), ("triviaqa", 4, 32), ("squad", 4, 32), ("gsm8k", 4, 96), ("flores_de_en", 4, 64)]
# The batching comparison doubles it: 48 prompts.
BATCH_SUITE = [(task, 2 * count, budget) for task, count, budget in SUITE]
BASELINES = ["unite", "deepen", "sweetspan", "llm_blender"]


def task_requests(name: str, count: int, data_dir: Path, budget: int = 64, prefix: bool = True) -> list[Request]:
    """The first `count` examples of a task as the runner asks for them: prompt, stop strings, `budget`, and
    (with `prefix`) the task's shared prefix, read once per model; without it, each prompt is read whole
    (as lm-eval's requests are)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_object(compose_run(f"task={name}", f"task.limit={count}").task)
    task = Task(cfg, DataConf(dir=str(data_dir)))
    shared = task.prefix if prefix else ""
    return [Request(task.prompt(ex), cfg.stop, budget, prefix=shared) for ex in task.examples]


def cpu_model() -> str:
    """The processor's model name (Linux), else what the platform says: figures differ by machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


SINGLES_RUNS = ["adafuse", "adafuse_b1", "single_0", "single_1", *BASELINES]


def compare_with_singles(ens: Ensemble, data_dir: Path, scale: float, tasks: list[str], names: list[str]) -> dict:
    """Wall time of each run in `names` (AdaFuse and both members always) against the members' summed greedy time."""
    every = {
        "adafuse": dict(method="adafuse"),
        "adafuse_b1": dict(method="adafuse", branches=1),
        "single_0": dict(method="single", member=0),
        "single_1": dict(method="single", member=1),
        **{name: dict(method=name) for name in BASELINES},
    }
    runs = {name: kwargs for name, kwargs in every.items() if name in {"adafuse", "single_0", "single_1", *names}}
    baselines = [name for name in BASELINES if name in runs]
    totals = {
        name: {"seconds": 0.0, "rounds": 0, "early_finish": 0, "forward": [0, 0], "fed": [0, 0], "generated": [0, 0]}
        for name in runs
    }
    per_task = {}
    for task, count, budget in [row for row in SUITE if row[0] in tasks]:
        prompts = task_requests(task, max(1, int(count * scale)), data_dir, budget)
        for kwargs in runs.values():  # warm-up: read the task's shared few-shot prefix once per method
            ens.decode(prompts[0], max_new_tokens=1, **kwargs)
        seconds = {name: 0.0 for name in runs}
        for prompt in prompts:
            for name, kwargs in runs.items():
                gen = ens.decode(prompt, **kwargs)
                t = totals[name]
                t["seconds"] += gen.stats.seconds
                seconds[name] += gen.stats.seconds
                t["rounds"] += gen.stats.rounds
                t["early_finish"] += gen.stats.early_finish  # examples whose last round ended unscored
                members = [kwargs["member"]] if "member" in kwargs else [0, 1]
                for k, member in enumerate(members):
                    t["forward"][member] += gen.stats.forward_passes[k]
                    t["fed"][member] += gen.stats.tokens_fed[k]
                    t["generated"][member] += gen.stats.tokens_generated[k]
        singles = seconds["single_0"] + seconds["single_1"]
        per_task[task] = {
            "prompts": len(prompts),
            "budget": budget,
            **seconds,
            "ratio": seconds["adafuse"] / singles,
            **({"ratio_b1": seconds["adafuse_b1"] / singles} if "adafuse_b1" in runs else {}),
            **{f"ratio_{name}": seconds[name] / singles for name in baselines},
        }
        print(f"  {task:13s} {len(prompts):2d} prompts  ratio {per_task[task]['ratio']:.2f}", flush=True)
    af = totals["adafuse"]
    singles = totals["single_0"]["seconds"] + totals["single_1"]["seconds"]
    # greedy decoding with each member: its passes per token, summed over the two members
    greedy_passes = sum(
        totals[f"single_{k}"]["forward"][k] / max(totals[f"single_{k}"]["generated"][k], 1) for k in (0, 1)
    )
    return {
        "prompts": sum(t["prompts"] for t in per_task.values()),
        "per_task": per_task,
        "totals": totals,
        "ratio_vs_sum_of_singles": af["seconds"] / singles,
        **({"ratio_b1_vs_sum_of_singles": totals["adafuse_b1"]["seconds"] / singles} if "adafuse_b1" in runs else {}),
        # the paper's runtime comparison: every method against the members' summed greedy cost
        "methods_vs_sum_of_singles": {
            name: {
                "wall_time": totals[name]["seconds"] / singles,
                "forward_passes_per_generated_token": passes_per_token(totals[name]) / greedy_passes,
            }
            for name in ["adafuse", *baselines]
        },
        "forward_passes_per_round": [f / af["rounds"] for f in af["forward"]],
        "tokens_fed_per_generated_token": {
            "adafuse": [f / max(g, 1) for f, g in zip(af["fed"], af["generated"])],
            "single": [totals[f"single_{k}"]["fed"][k] / max(totals[f"single_{k}"]["generated"][k], 1) for k in (0, 1)],
        },
    }


def passes_per_token(t: dict) -> float:
    """Forward passes of all members per generated token (the output's length averaged over members)."""
    return sum(t["forward"]) / max(sum(t["generated"]) / len(t["generated"]), 1)


def compare_with_reference(ens: Ensemble, data_dir: Path, count: int, budget: int) -> dict:
    """Fast vs cache-free reference on GSM8K prompts with 2 exemplars (700-900 tokens per model).

    The fast decoder has read the shared exemplars once before timing, as it has on every example
    of a task run but the first; the reference re-reads the whole context for every quantity.
    """
    shots = (data_dir / "adafuse_local_datasets/GSM/gsm_prompt.txt").read_text().split("\n\n\n")[:2]
    questions = [json.loads(line)["question"] for line in (data_dir / "gsm8k/test.jsonl").open()][: count + 1]
    shared = "\n\n\n".join(shots) + "\n\n"
    prompts = [shared + f"Question: {q}\nLet's think step by step\n" for q in questions]
    cfg, fast_s, slow_s, identical, lengths = AdaFuseConfig(), 0.0, 0.0, 0, []
    adafuse = METHODS["adafuse"]
    drive(adafuse.generate(ens.members, Request(prompts.pop(), max_new_tokens=1, prefix=shared), cfg))  # the exemplars
    for prompt in prompts:
        started = time.perf_counter()
        fast = drive(adafuse.generate(ens.members, Request(prompt, max_new_tokens=budget, prefix=shared), cfg))
        fast_s += time.perf_counter() - started
        started = time.perf_counter()
        slow_text = reference.generate(ens.members, Request(prompt, max_new_tokens=budget), cfg).text
        slow_s += time.perf_counter() - started
        identical += slow_text == fast.text
        lengths.append(min(len(m.tokenisation.encode(prompt)) for m in ens.members))
        print(f"  {lengths[-1]} prompt tokens: fast {fast_s:.1f}s, reference {slow_s:.1f}s so far", flush=True)
    return {
        "prompts": len(prompts),
        "prompt_tokens": lengths,
        "budget": budget,
        "fast_seconds": fast_s,
        "reference_seconds": slow_s,
        "speedup": slow_s / fast_s,
        "identical_outputs": identical,
    }


class PeakMemory:
    """The highest resident memory above the start, sampled every 50 ms while the block runs.

    glibc keeps freed memory in the process, so a run after a bigger one would grow into it and read
    +0; the free memory is handed back to the system first (malloc_trim) so that each run counts its own.
    """

    def __enter__(self):
        gc.collect()
        if LIBC is not None:
            LIBC.malloc_trim(0)
        self.process, self.start, self.peak, self.running = psutil.Process(), 0, 0, True
        self.start = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss - self.start)
            time.sleep(0.05)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()


def decode_suite(
    ens: Ensemble, cases: list, method: str, options: dict, batch_size: int, exact: bool = True
) -> tuple[list, dict]:
    """Decode every case (a Request) with `batch_size` in flight, merged passes `exact` or not
    (adafuse/backend/cpu/tiles.py): (texts in case order, figures)."""
    spec, cfg = resolve_method(method, options)

    def one(members, i):
        return spec.generate(members, cases[i], cfg)

    executor, texts = Executor(exact=exact), [None] * len(cases)
    started = time.perf_counter()
    with PeakMemory() as memory:
        for i, gen in decode_many(ens.members, range(len(cases)), one, batch_size, executor):
            texts[i] = gen.text
    seconds = time.perf_counter() - started
    return texts, {
        "seconds": seconds,
        "examples_per_second": len(cases) / seconds,
        "passes": executor.passes,
        "rows_per_pass": sum(c.rows for c in executor.counts.values()) / max(executor.passes, 1),
        "peak_memory_gb": memory.peak / 1024**3,
    }


def compare_batch_sizes(
    ens: Ensemble, data_dir: Path, sizes: list[int], scale: float, only: list[str], task: str | None = None
) -> dict:
    """Each run at each batch size on the same prompts: the mixed suite, or 48 prompts of one `task`
    (a run of the runner decodes one task: no other task's long examples leave a tail)."""
    suite = BATCH_SUITE if task is None else [(task, 48, {t: b for t, _, b in SUITE}[task])]
    cases = []
    for name, count, budget in suite:
        requests = task_requests(name, max(1, int(count * scale)), data_dir, budget)
        cases += requests
        ens.decode(requests[0], max_new_tokens=1)  # warm-up: the models load their kernels
    runs = {"adafuse": ("adafuse", {}), "single_0": ("single", {"member": 0}), "single_1": ("single", {"member": 1})}
    runs = {name: run for name, run in runs.items() if name in only}
    figures, baseline_texts = {}, {}
    for name, (method, options) in runs.items():
        for size in sizes:
            texts, row = decode_suite(ens, cases, method, options, size)
            baseline_texts.setdefault(name, texts)
            row["identical_to_batch_1"] = sum(a == b for a, b in zip(texts, baseline_texts[name]))
            figures[f"{name}@{size}"] = row
            print(
                f"  {name:9s} batch {size:2d}: {row['examples_per_second']:.3f} ex/s, "
                f"{row['rows_per_pass']:.1f} rows/pass, identical {row['identical_to_batch_1']}/{len(cases)}, "
                f"peak +{row['peak_memory_gb']:.2f} GB",
                flush=True,
            )
    out = {"prompts": len(cases), "tasks": [t for t, _, _ in suite], "sizes": sizes, "runs": figures}
    for name in runs:
        best = max(sizes, key=lambda b: figures[f"{name}@{b}"]["examples_per_second"])
        out[f"{name}_best_batch_size"] = best
        out[f"{name}_speedup"] = (
            figures[f"{name}@{best}"]["examples_per_second"] / figures[f"{name}@1"]["examples_per_second"]
        )
    if len(runs) == 3:
        singles_seconds = figures["single_0@1"]["seconds"] + figures["single_1@1"]["seconds"]
        out["adafuse_best_vs_unbatched_singles"] = (
            figures[f"adafuse@{out['adafuse_best_batch_size']}"]["seconds"] / singles_seconds
        )
    return out


def compare_with_authors(ens: Ensemble, data_dir: Path, authors_code: Path, count: int, options: dict) -> dict:
    """Their decoder, ours (`adafuse_code`, the same knobs), our `adafuse` and the single models on the
    first `count` questions of their NQ test file, prompt by prompt (machine drift hits all alike).

    Their code runs in this process through tools/authors_code.py (models loaded once, not timed, no
    recording); `options` are our knobs, passed to theirs under their flag names. Outputs compared:
    their `pred` against ours (`stats.notes["authors_pred"]`)."""
    from tools.authors_code import TASKS, AuthorsCode

    test_set, prompt_file = (data_dir / "adafuse_local_datasets" / part for part in TASKS["nq"])
    cfg = METHODS["adafuse_code"].config(**options)
    flags = dict(
        theta_delta=cfg.tau, beam_size=cfg.branches, span_length=cfg.span_length, max_span_rounds=cfg.max_rounds
    )
    workdir = tempfile.mkdtemp(prefix="authors_code_")  # their worker writes its logs and outputs there
    theirs = AuthorsCode(authors_code, "two", [str(m.model.name_or_path) for m in ens.members], None, workdir)
    few_shot = prompt_file.read_text(encoding="utf-8")
    questions = [json.loads(line)["question"] for line in test_set.open(encoding="utf-8")][:count]
    runs = {
        "adafuse_code": dict(method="adafuse_code", **options, max_new_tokens=512, prefix=few_shot),
        "adafuse": dict(method="adafuse", stop=["\n"], max_new_tokens=32, prefix=few_shot),
        "single_0": dict(method="single", member=0, stop=["\n"], max_new_tokens=32, prefix=few_shot),
        "single_1": dict(method="single", member=1, stop=["\n"], max_new_tokens=32, prefix=few_shot),
    }
    seconds = {name: 0.0 for name in ["authors", *runs]}
    identical, rows = 0, []
    for kwargs in runs.values():  # warm-up: read the shared few-shot prefix once per method
        ens.decode(few_shot + f"\n\nQuestion: {questions[0]}\nAnswer:", **{**kwargs, "max_new_tokens": 1})
    for index, question in enumerate(questions):
        prompt = few_shot + f"\n\nQuestion: {question}\nAnswer:"  # their qa_collate_fn
        (their,) = theirs.run(test_set, prompt_file, [index], record=False, **flags)
        seconds["authors"] += their["wall_s"]
        row = {"question": question, "authors_pred": their["pred"], "authors_s": their["wall_s"]}
        for name, kwargs in runs.items():
            gen = ens.decode(prompt, **kwargs)
            seconds[name] += gen.stats.seconds
            row[f"{name}_s"] = gen.stats.seconds
            if name == "adafuse_code":
                row["pred"] = gen_pred = gen.stats.notes["authors_pred"]
        identical += gen_pred == their["pred"]
        rows.append(row)
        print(
            f"  [{index}] theirs {their['wall_s']:.1f}s, ours {row['adafuse_code_s']:.2f}s "
            f"({their['wall_s'] / row['adafuse_code_s']:.1f}x), pred {their['pred']!r} "
            f"{'==' if gen_pred == their['pred'] else '!='} {gen_pred!r}",
            flush=True,
        )
    # as the runner decodes a task: examples in flight together (adafuse/engine/loop.py); not interleaved
    prompts = [few_shot + f"\n\nQuestion: {q}\nAnswer:" for q in questions]
    started = time.perf_counter()
    batched = ens.decode_batch(prompts, batch_size=8, **runs["adafuse_code"])
    seconds["adafuse_code_batch_8"] = time.perf_counter() - started
    singles = seconds["single_0"] + seconds["single_1"]
    return {
        "questions": len(questions),
        "knobs": asdict(cfg),
        "their_flags": flags,
        "seconds": seconds,
        "speedup_over_authors": seconds["authors"] / seconds["adafuse_code"],
        "speedup_over_authors_batch_8": seconds["authors"] / seconds["adafuse_code_batch_8"],
        "identical_preds_batch_8": sum(
            g.stats.notes["authors_pred"] == r["authors_pred"] for g, r in zip(batched, rows)
        ),
        "vs_sum_of_singles": {name: seconds[name] / singles for name in ["authors", "adafuse_code", "adafuse"]},
        "identical_preds": identical,
        "examples": rows,
    }


def compare_exact_batching(ens: Ensemble, data_dir: Path, task: str, limit: int) -> dict:
    """Section 6: AdaFuse on `limit` prompts of `task`, exact at batch 8, not exact at batch 8, exact at
    batch 1, one after another in one run (the same models, the same warm caches)."""
    budget = {t: b for t, _, b in SUITE}[task]
    cases = task_requests(task, limit, data_dir, budget)
    # warm-up, not timed: the prompt store reads the task's few-shot prefix, and the row tiles
    # (adafuse/backend/cpu/tiles.py) probe the row counts that merged passes of 8 examples reach
    decode_suite(ens, [replace(r, max_new_tokens=4) for r in cases[:8]], "adafuse", {}, 8)
    runs = {"exact_batch_8": (8, True), "not_exact_batch_8": (8, False), "exact_batch_1": (1, True)}
    figures, texts = {}, {}
    for name, (size, exact) in runs.items():
        texts[name], figures[name] = decode_suite(ens, cases, "adafuse", {}, size, exact)
        print(
            f"  {name:17s}: {figures[name]['examples_per_second']:.3f} ex/s ({figures[name]['seconds']:.1f} s), "
            f"{figures[name]['rows_per_pass']:.1f} rows/pass",
            flush=True,
        )
    exact_8, loose_8, exact_1 = (figures[name]["examples_per_second"] for name in runs)
    return {
        "task": task,
        "prompts": len(cases),
        "budget": budget,
        "runs": figures,
        "exact_8_over_exact_1": exact_8 / exact_1,
        "exact_8_over_not_exact_8": exact_8 / loose_8,
        "identical_exact_8_to_exact_1": sum(a == b for a, b in zip(texts["exact_batch_8"], texts["exact_batch_1"])),
        "identical_not_exact_8_to_exact_1": sum(
            a == b for a, b in zip(texts["not_exact_batch_8"], texts["exact_batch_1"])
        ),
    }


DEFAULT_RUNS = {
    "adafuse": [],
    "single_0": ["method=single", "method.member=0"],
    "single_1": ["method=single", "method.member=1"],
    # the same AdaFuse run with one model's passes after the other's, each on every core: what each model's
    # passes cost with nothing beside them (its predictions are the default's: the run id is the same)
    "adafuse_one_after": ["batch_side_by_side=false"],
}


def compare_default_run(repeats: int) -> dict:
    """Section 8: run.py's default command and each member alone, fresh processes, alternating; per run, the
    decode seconds and each model's pass seconds (metrics.json `batching`)."""
    seconds: dict[str, list[float]] = {name: [] for name in DEFAULT_RUNS}
    pass_seconds: dict[str, list[dict[str, float]]] = {name: [] for name in DEFAULT_RUNS}
    identical: dict[str, int] = {}
    examples = 0
    for repeat in range(repeats):
        for name, overrides in DEFAULT_RUNS.items():
            with tempfile.TemporaryDirectory() as out:
                command = [sys.executable, "run.py", f"results_dir={out}", "wandb.mode=disabled", *overrides]
                subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
                (run_dir,) = {path.parent for path in Path(out).glob("nq/*/tiny/*/metrics.json")}
                metrics = json.loads((run_dir / "metrics.json").read_text())
                seconds[name].append(metrics["throughput"]["seconds"])
                pass_seconds[name].append({m: how["seconds"] for m, how in metrics["batching"]["models"].items()})
                identical[name], examples = identical_to_grid(run_dir, ROOT / "results/grid" / run_dir.relative_to(out))
            print(f"  {repeat + 1}/{repeats} {name:17s} {seconds[name][-1]:6.1f} s", flush=True)
    best = {name: min(values) for name, values in seconds.items()}
    return {
        "examples": examples,
        "repeats": repeats,
        "seconds": seconds,
        "pass_seconds": pass_seconds,
        "ratio_of_best": best["adafuse"] / (best["single_0"] + best["single_1"]),
        "ratio_per_repeat": [
            a / (s0 + s1) for a, s0, s1 in zip(seconds["adafuse"], seconds["single_0"], seconds["single_1"])
        ],
        **passes_alone_over_members(seconds, pass_seconds),
        "identical_to_grid": identical,
    }


MEMORY_RUN = ["task=gsm8k", "task.limit=8"]


def compare_memory() -> dict:
    """Section 11: run.py on 8 GSM8K problems at batch 8 and batch 1, fresh processes: peak RSS, KV figures,
    predictions against each other and the committed grid run."""
    runs, predictions = {}, {}
    for batch_size in (8, 1):
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, "run.py", *MEMORY_RUN, f"batch_size={batch_size}", f"results_dir={out}"]
            child = subprocess.Popen([*command, "wandb.mode=disabled"], cwd=ROOT, stdout=subprocess.DEVNULL)
            _, status, usage = os.wait4(child.pid, 0)
            if status:
                raise SystemExit(f"{' '.join(command)} failed ({status})")
            (run_dir,) = {path.parent for path in Path(out).glob("gsm8k/*/tiny/*/metrics.json")}
            metrics = json.loads((run_dir / "metrics.json").read_text())
            models = metrics["batching"]["models"]
            runs[batch_size] = {
                "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,  # Linux reports kilobytes
                "seconds": metrics["throughput"]["seconds"],
                "models": {
                    name: {key: how[key] for key in ("kv_peak_bytes", "kv_peak_bytes_per_example", "kv_prefix_bytes")}
                    | {"one_context_bytes": how["kv_bytes_per_token"] * how["longest_context"]}
                    for name, how in models.items()
                },
                "identical_to_grid": identical_to_grid(run_dir, ROOT / "results/grid" / run_dir.relative_to(out))[0],
            }
            predictions[batch_size] = {
                i: r["prediction"] for i, r in read_predictions(run_dir / "predictions.jsonl").items()
            }
        print(f"  batch {batch_size}: peak RSS {runs[batch_size]['peak_rss_gb']:.2f} GB", flush=True)
    return {
        "command": "python run.py " + " ".join(MEMORY_RUN),
        "examples": len(predictions[8]),
        "runs": runs,
        "identical_8_to_1": sum(predictions[1].get(i) == text for i, text in predictions[8].items()),
        "kv_per_example_over_one_context": {
            name: how["kv_peak_bytes_per_example"] / how["one_context_bytes"] for name, how in runs[8]["models"].items()
        },
    }


def passes_alone_over_members(seconds: dict[str, list[float]], pass_seconds: dict[str, list[dict]]) -> dict:
    """AdaFuse's passes run one model after the other (each on every core, nothing beside it), best run, over the
    members' best decode seconds summed: the slower model's passes (no schedule of the two models' passes ends
    sooner, short of a model's passes running faster on part of the machine than on all of it) and both models'
    passes (where neither model's kernels leave a core idle, running the two side by side saves nothing)."""
    members = min(seconds["single_0"]) + min(seconds["single_1"])
    runs = pass_seconds["adafuse_one_after"]
    return {
        "slowest_model_passes_alone_over_members": min(max(run.values()) for run in runs) / members,
        "both_models_passes_alone_over_members": min(sum(run.values()) for run in runs) / members,
    }


def identical_to_grid(run_dir: Path, grid_dir: Path) -> tuple[int, int]:
    """(predictions equal to the committed grid run's, predictions) by example id."""
    grid = read_predictions(grid_dir / "predictions.jsonl")
    ours = read_predictions(run_dir / "predictions.jsonl")
    return sum(id_ in grid and grid[id_]["prediction"] == r["prediction"] for id_, r in ours.items()), len(ours)


PROJECTION_ROWS = (1, 2, 3, 5, 8, 16, 32, 64)


@torch.inference_mode()
def compare_projection(ens: Ensemble, repeats: int) -> dict:
    """Section 5: per model and row count, the best of `repeats` interleaved timings of the blocked
    projection and of one F.linear, their ratio, and whether the logits are identical."""
    record = {}
    for member in ens.members:
        head = member.model.get_output_embeddings()
        generator = torch.Generator().manual_seed(0)
        rows_record = {}
        for rows in PROJECTION_ROWS:
            x = torch.randn(rows, head.in_features, generator=generator)
            ways = {"blocked": head, "f_linear": functools.partial(F.linear, weight=head.weight, bias=head.bias)}
            seconds = {name: [] for name in ways}
            for _ in range(repeats):
                for name, multiply in ways.items():
                    start = time.perf_counter()
                    multiply(x)
                    seconds[name].append(time.perf_counter() - start)
            best = {name: min(times) for name, times in seconds.items()}
            rows_record[rows] = {
                "blocked_ms": 1000 * best["blocked"],
                "f_linear_ms": 1000 * best["f_linear"],
                "speedup": best["f_linear"] / best["blocked"],
                "identical": torch.equal(ways["blocked"](x), one_multiply_in_tiles(head, x)),
            }
        record[member.name] = {"vocab": head.out_features, "hidden": head.in_features, "rows": rows_record}
    return record


def one_multiply_in_tiles(head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The canonical logits the blocked projection must give: one F.linear over the whole matrix, the rows
    padded to the blocks' row tiles (adafuse/backend/cpu/tiles.py), as tests/engine/test_projection.py checks."""
    bias = None if head.bias is None else head.bias[:BLOCK_ROWS]
    padded = pad_to_tiles(backend_for(head.weight.device).probes, x, head.weight[:BLOCK_ROWS], bias)
    return F.linear(padded, head.weight, head.bias)[: x.shape[0]]


def compare_with_lm_eval(data_dir: Path, count: int, batch_size: int, repeats: int) -> dict:
    """AdaFuse on `count` NQ prompts through lm_eval and as the runner decodes them, `repeats` times each,
    alternating the order so that machine drift hits both alike."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from eval.lm_harness import AdaFuseLM
    from eval.lm_tasks import write_tasks

    model = AdaFuseLM(pair="tiny", method="adafuse", batch_size=batch_size)
    budget = {t: b for t, _, b in SUITE}["nq"]
    requests = task_requests("nq", count, data_dir, budget, prefix=False)  # whole prompts, as lm_eval sends them
    model.ensemble.decode(requests[0], max_new_tokens=1)  # warm-up: the kernels

    def runner() -> list[str]:
        stream = model.ensemble.decode_stream(
            enumerate(requests), batch_size=batch_size, method=model.method, executor=Executor()
        )
        return [gen.text for _, gen in sorted(stream, key=lambda item: item[0])]

    with tempfile.TemporaryDirectory() as folder:
        write_tasks(Path(folder), str(data_dir), tasks=["nq"], limit=count)
        manager = TaskManager(include_path=folder)

        def harness() -> list[str]:
            results = simple_evaluate(model=model, tasks=["adafuse_nq"], task_manager=manager, log_samples=True)
            return [s["resps"][0][0] for s in sorted(results["samples"]["adafuse_nq"], key=lambda s: s["doc_id"])]

        seconds, texts = {"runner": [], "lm_eval": []}, {}
        for repeat in range(repeats):
            order = [("runner", runner), ("lm_eval", harness)]
            for name, run in order if repeat % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                texts[name] = run()
                seconds[name].append(time.perf_counter() - started)
                print(f"  {name:8s} run {repeat + 1}: {seconds[name][-1]:.1f}s", flush=True)
    return {
        "prompts": len(requests),
        "batch_size": batch_size,
        "budget": budget,
        "seconds": seconds,
        "ratio_lm_eval_vs_runner": sum(seconds["lm_eval"]) / sum(seconds["runner"]),
        "identical_texts": sum(a == b for a, b in zip(texts["runner"], texts["lm_eval"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=BESIDE_CHECKOUT)
    parser.add_argument("--quick", action="store_true", help="a quarter of the prompts, one reference prompt")
    parser.add_argument("--scale", type=float, help="the fraction of each task's prompts to use (--quick: 0.25)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument(
        "--only",
        choices=[
            "singles",
            "reference",
            "batching",
            "authors",
            "projection",
            "lm_eval",
            "exact",
            "default_run",
            "overhead",
            "serve",
            "memory",
            "host",
        ],
        help="run one section (1 to 12)",
    )
    parser.add_argument("--authors-code", type=Path, help="a checkout of CCM0111/AdaFuse (section 4)")
    parser.add_argument("--authors-questions", type=int, default=10, help="NQ questions for section 4")
    parser.add_argument(
        "--authors-knobs", default="", help="section 4's knobs, e.g. 'branches=1,span_length=1' (default: ours)"
    )
    parser.add_argument(
        "--batching-runs",
        nargs="+",
        default=["adafuse", "single_0", "single_1"],
        help="section 3's methods (all three: the ratio to greedy)",
    )
    parser.add_argument(
        "--tasks", nargs="+", choices=[t for t, _, _ in SUITE], help="section 1's tasks (default: all five)"
    )
    parser.add_argument(
        "--singles-runs",
        nargs="+",
        choices=SINGLES_RUNS,
        default=SINGLES_RUNS,
        help="section 1's runs besides AdaFuse and the two members (default: all)",
    )
    parser.add_argument("--batching-task", choices=[t for t, _, _ in SUITE], help="48 prompts of one task, not the mix")
    parser.add_argument("--lm-eval-batch-size", type=int, default=8, help="section 6's examples in flight")
    parser.add_argument("--lm-eval-repeats", type=int, default=2, help="section 6's runs of each")
    parser.add_argument(
        "--limit",
        type=int,
        help="section 7's prompts (of --batching-task, default nq; 48), section 9's (24), section 10's (48)",
    )
    parser.add_argument(
        "--repeats", type=int, help="section 8's runs of each command (2), section 9's (3), section 10's (2)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="default: results/bench/decode.json (reference.json, authors.json, projection.json, exact_batching.json "
        "with --only those)",
    )
    args = parser.parse_args()
    args.limit = args.limit or {"overhead": 24, "host": 16}.get(args.only, 48)
    args.repeats = args.repeats or {"overhead": 3, "host": 7}.get(args.only, 2)
    # a section run alone leaves the full run's decode.json as that run wrote it
    own_file = {
        "reference": "reference.json",
        "authors": "authors.json",
        "projection": "projection.json",
        "lm_eval": "lm_eval.json",
        "exact": "exact_batching.json",
        "default_run": "default_run.json",
        "overhead": "overhead.json",
        "serve": "serve.json",
        "memory": "memory.json",
        "host": "host.json",
    }
    args.out = args.out or ROOT / "results/bench" / own_file.get(args.only, "decode.json")
    torch.set_num_threads(args.threads)

    # section 6 loads the pair through the lm_eval model, which holds its own; section 8 runs run.py; section 9
    # decodes with the paper's pair in shape
    own_models = ("lm_eval", "default_run", "overhead", "memory", "host")
    ens = None if args.only in own_models else Ensemble.from_config(["smollm2_135m", "gemma3_270m"])
    scale = args.scale or (0.25 if args.quick else 1.0)
    record = {
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
    }
    if args.only in (None, "batching"):
        print("3. batching across examples (same prompts at each batch size)", flush=True)
        record["batching"] = batching = compare_batch_sizes(
            ens, args.data_dir, args.batch_sizes, scale, args.batching_runs, args.batching_task
        )
        for name in args.batching_runs:
            goal = "(goal >= 3)" if name == "adafuse" else "(goal >= 4)" if name == "single_0" else ""
            print(
                f"{name} throughput, best batch ({batching[f'{name}_best_batch_size']}) / batch 1: "
                f"{batching[f'{name}_speedup']:.2f}x {goal}"
            )
        if "adafuse_best_vs_unbatched_singles" in batching:
            print(
                "AdaFuse at its best batch size / unbatched (SmolLM2 + Gemma greedy): "
                f"{batching['adafuse_best_vs_unbatched_singles']:.2f} (goal <= 1.0)"
            )
    if args.only in (None, "reference"):
        print("2. fast decoder vs the cache-free reference (500+-token few-shot prompts)", flush=True)
        record["reference"] = ref = compare_with_reference(ens, args.data_dir, 1 if args.quick else 3, 16)
        print(
            f"fast vs cache-free reference: {ref['speedup']:.1f}x faster on {ref['prompts']} prompts of "
            f"{min(ref['prompt_tokens'])}-{max(ref['prompt_tokens'])} tokens, {ref['budget']} new tokens "
            f"(goal >= 20x); identical outputs {ref['identical_outputs']}/{ref['prompts']}"
        )
    if args.only == "authors" or args.only is None and args.authors_code:
        if not args.authors_code:
            parser.error("--only authors needs --authors-code PATH (a checkout of CCM0111/AdaFuse)")
        options = {
            k: float(v) if k == "tau" else int(v)
            for k, v in (kv.split("=") for kv in args.authors_knobs.split(",") if kv)
        }
        print("4. the authors' decoder vs ours (adafuse_code), adafuse and the single models, NQ", flush=True)
        record["authors"] = authors = compare_with_authors(
            ens, args.data_dir, args.authors_code, 2 if args.quick else args.authors_questions, options
        )
        ratio = authors["vs_sum_of_singles"]
        print(
            f"their code {authors['seconds']['authors']:.1f}s, ours {authors['seconds']['adafuse_code']:.1f}s: "
            f"{authors['speedup_over_authors']:.1f}x faster (goal >= 10x); identical preds "
            f"{authors['identical_preds']}/{authors['questions']}; ÷ summed greedy: theirs {ratio['authors']:.1f}, "
            f"ours {ratio['adafuse_code']:.2f}, adafuse {ratio['adafuse']:.2f}"
        )
        print(
            f"ours as the runner runs it (8 examples in flight): {authors['seconds']['adafuse_code_batch_8']:.1f}s, "
            f"{authors['speedup_over_authors_batch_8']:.1f}x faster; identical preds "
            f"{authors['identical_preds_batch_8']}/{authors['questions']}"
        )
    if args.only == "projection":
        print("5. the vocabulary projection: blocked / one F.linear (best of 20, interleaved)", flush=True)
        record["projection"] = projection = compare_projection(ens, 20)
        for name, model in projection.items():
            for rows, row in model["rows"].items():
                print(
                    f"    {name:13s} {rows:3d} rows: F.linear {row['f_linear_ms']:6.1f} ms, blocked "
                    f"{row['blocked_ms']:6.1f} ms, {row['speedup']:.2f}x, identical {row['identical']}"
                )
    if args.only == "lm_eval":
        print("6. AdaFuse through lm_eval vs the runner's decoding (same NQ prompts, same batch size)", flush=True)
        count = max(1, int(48 * scale))
        record["lm_eval"] = harness = compare_with_lm_eval(
            args.data_dir, count, args.lm_eval_batch_size, args.lm_eval_repeats
        )
        print(
            f"lm_eval / runner wall time: {harness['ratio_lm_eval_vs_runner']:.3f} (goal <= 1.10) on "
            f"{harness['prompts']} prompts at batch size {harness['batch_size']}; identical texts "
            f"{harness['identical_texts']}/{harness['prompts']}"
        )
    if args.only == "exact":
        task = args.batching_task or "nq"
        print(f"7. exact batching: AdaFuse on {args.limit} {task} prompts, exact / not exact at batch 8, exact at 1")
        record["exact"] = exact = compare_exact_batching(ens, args.data_dir, task, args.limit)
        print(
            f"exact batch 8 / exact batch 1: {exact['exact_8_over_exact_1']:.2f}x (goal >= 1.7); exact batch 8 / "
            f"not exact batch 8: {exact['exact_8_over_not_exact_8']:.2f} (goal >= 0.9); identical to exact batch 1: "
            f"exact batch 8 {exact['identical_exact_8_to_exact_1']}/{exact['prompts']}, not exact batch 8 "
            f"{exact['identical_not_exact_8_to_exact_1']}/{exact['prompts']}"
        )
    if args.only == "default_run":
        print("8. run.py's default command against each member alone (fresh processes, alternating)", flush=True)
        record["default_run"] = run = compare_default_run(args.repeats)
        print(
            f"AdaFuse / (member 0 + member 1), best of {run['repeats']}: {run['ratio_of_best']:.2f} (goal <= 2.0); "
            f"AdaFuse's passes one model after the other / (member 0 + member 1): the slower model's "
            f"{run['slowest_model_passes_alone_over_members']:.2f}, both models' "
            f"{run['both_models_passes_alone_over_members']:.2f}; "
            f"identical to results/grid: {run['identical_to_grid']} of {run['examples']}"
        )
    if args.only == "overhead":
        print(f"9. host time per pass: {args.limit} nq prompts on the paper's pair in shape, float32", flush=True)
        record["overhead"] = overhead = compare_overhead(
            task_requests("nq", args.limit, args.data_dir, 32), args.repeats
        )
        for name, value in overhead["ratios"].items():
            print(f"  {name}: {value:.2f} (median of {overhead['repeats']})")
        print(f"  identical: {overhead['identical']}")
    if args.only == "host":
        print(f"12. host time per pass at the real depth: {args.limit} nq prompts, float32", flush=True)
        record["host"] = host = compare_host(task_requests("nq", args.limit, args.data_dir, 24), args.repeats)
        for part, goal in (("pass", "for 8: <= 1.5"), ("decode", "for adafuse_b8: <= 1.0")):
            for name, value in host[part]["ratios"].items():
                host_time = host[part]["host_ratios"].get(name)
                host_time = "" if host_time is None else f", host time {host_time:.2f}"
                print(f"  {name}: {value:.2f}{host_time} (goal {goal})")
        print(f"  KV bytes copied per pass: {host['copies']['kv_bytes_copied_per_pass']:.0f} (goal 0)")
        kernel_path = host["kernel_path"]
        print("  the CUDA backend's code, its kernels stood in for:")
        for name, value in kernel_path["host_ratios"].items():
            print(f"    {name}: host time {value:.2f} (goal for 8: <= 1.5)")
        ratio, copied = kernel_path["adafuse_b8_host_over_summed_generate"], kernel_path["adafuse_b8"]
        print(f"    adafuse_b8_over_summed_generate: host time {ratio:.2f} (goal <= 1.0); KV bytes copied per pass: "
              f"{copied['kv_bytes_copied_per_pass']:.0f} (goal 0)")  # fmt: skip
    if args.only == "serve":
        print(f"10. adafuse-serve against offline decoding: {args.limit} nq prompts, 1, 8 and 32 clients", flush=True)
        record["serve"] = serve = compare_serve(
            ens, task_requests("nq", args.limit, args.data_dir, 32), 8, args.threads, args.repeats
        )
        print(f"  server / offline at 8 clients: {serve['served']['8']['over_offline']:.2f} (goal <= 1.10)")
    if args.only == "memory":
        print("11. what a batch holds: run.py on 8 GSM8K problems at batch 8 and batch 1 (fresh processes)", flush=True)
        record["memory"] = memory = compare_memory()
        ratios = ", ".join(f"{name} {v:.2f}" for name, v in memory["kv_per_example_over_one_context"].items())
        print(
            f"  peak RSS at batch 8: {memory['runs'][8]['peak_rss_gb']:.2f} GB (goal <= 5.0); KV per example in "
            f"flight / one context: {ratios} (goal <= 2); batch 8 identical to batch 1: "
            f"{memory['identical_8_to_1']}/{memory['examples']}, "
            f"to results/grid: {memory['runs'][8]['identical_to_grid']}"
        )
    if args.only in (None, "singles"):
        print("1. every method vs the two single models (same prompts, interleaved)", flush=True)
        record["singles"] = singles = compare_with_singles(
            ens, args.data_dir, scale, args.tasks or [t for t, _, _ in SUITE], args.singles_runs
        )
        report_singles(singles)
    # other processes share this machine: the 1, 5 and 15 minute load averages at the end of the run
    record.update(peak_rss_gb=peak_rss_gb(), quick=args.quick, load_average=os.getloadavg())
    print(f"peak RSS: {peak_rss_gb():.2f} GB")
    write(args, record)


def report_singles(singles: dict) -> None:
    t = singles["totals"]
    print(f"\nprompts: {singles['prompts']} real benchmark prompts ({', '.join(singles['per_task'])})")
    print(
        f"wall time: AdaFuse {t['adafuse']['seconds']:.1f}s, SmolLM2 {t['single_0']['seconds']:.1f}s, "
        f"Gemma {t['single_1']['seconds']:.1f}s"
    )
    print(
        f"AdaFuse / (sum of singles):           {singles['ratio_vs_sum_of_singles']:.2f}  (goal <= 1.6)"
        + (
            f"; with B = 1: {singles['ratio_b1_vs_sum_of_singles']:.2f}"
            if "ratio_b1_vs_sum_of_singles" in singles
            else ""
        )
    )
    print(f"AdaFuse examples that ended in an unscored round (early finish): {t['adafuse']['early_finish']}")
    for task, row in singles["per_task"].items():
        print(f"    {task:13s} {row['ratio']:.2f}" + (f"   B = 1: {row['ratio_b1']:.2f}" if "ratio_b1" in row else ""))
    print("every method / (sum of singles): wall time, forward passes per generated token")
    for name, row in singles["methods_vs_sum_of_singles"].items():
        print(f"    {name:12s} {row['wall_time']:.2f}   {row['forward_passes_per_generated_token']:.2f}")
    fwd = singles["forward_passes_per_round"]
    print(f"forward passes per round (per model): {fwd[0]:.2f} / {fwd[1]:.2f}")
    fed = singles["tokens_fed_per_generated_token"]
    print(
        f"tokens fed per generated token:       AdaFuse {fed['adafuse'][0]:.2f} / {fed['adafuse'][1]:.2f}, "
        f"single {fed['single'][0]:.2f} / {fed['single'][1]:.2f} (includes the prompt prefill)"
    )


def write(args, record: dict) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
