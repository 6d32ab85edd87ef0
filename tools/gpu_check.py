"""The GPU check: on a machine with a CUDA GPU, in under 8 minutes, one JSON.

    python -m tools.gpu_check              # results/bench/gpu_check.json
    python -m tools.gpu_check --dry-run    # on a CPU: every step at its smallest, to check the script
    python -m tools.gpu_check --full       # the paper's pair on the user's path instead (tools/gpu_full.py)

1. The reference-agreement tests on the device (pytest: the fast decoder against the cache-free
   reference; batch invariance and single == generate() on the paper-shaped pair).
2. The paper's pair in shape (tools/make_paper_pair.py) in bfloat16 at batch size 1 and 8: `single`
   (both members) and AdaFuse on the harness's NQ prompts; outputs identical to batch size 1 with exact
   batching, and without it; each greedy step's log-probability bit for bit; the time of each; and how
   each model's requests met in merged passes (whether this GPU's matrix multiplies depend on the
   number of rows; exact passes multiply in row tiles either way: adafuse/backend/tiles.py).
3. tools/bench_decode.py's exact-batching section (AdaFuse exact at batch 8, not exact at batch 8, exact
   at batch 1, on 48 NQ prompts) with the paper's pair in shape in bfloat16: does exact batching pay here?
4. tools/bench_decode.py's AdaFuse section (every method against the members' greedy decoding) and
   its batching section (batch sizes 1 and 8), on a quarter of their prompts.

Each step runs within what is left of the time limit and is recorded as it ends, so a step that runs
out of time loses only itself. Needs the project installed with a CUDA build of torch
(`TORCH="torch --index-url https://download.pytorch.org/whl/cu124" bash scripts/install.sh`).
"""

import argparse
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import torch

from adafuse import AdaFuseConfig, Ensemble, SingleConfig
from adafuse.config import ModelConfig
from adafuse.engine.executor import Executor
from adafuse.engine.loop import decode_many, drive
from adafuse.methods import METHODS
from eval.tasks import BESIDE_CHECKOUT as SHARED_DATA
from tools import gpu_full, make_paper_pair
from tools.bench_decode import compare_exact_batching, task_requests
from tools.gpu_record import StepRecord, environment

ROOT = Path(__file__).resolve().parent.parent

TESTS = [
    "tests/engine/test_reference_agreement.py::test_fast_decoder_equals_reference_on_varied_prompts",
    "tests/engine/test_reference_agreement.py::test_ensembles_of_one_to_four_models_agree_with_reference",
    "tests/engine/test_invariance.py",
    "tests/engine/test_paper_pair_methods.py::test_adafuse_agrees_with_the_reference",
    "tests/engine/test_paper_pair_methods.py::test_single_equals_generate",
]


def reference_tests(out: Path, dry_run: bool, seconds: float) -> dict:
    junit = out.parent / "gpu_check_tests.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *TESTS]
    if dry_run:
        command.append("--collect-only")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
    suite = ET.parse(junit).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    result = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    result.update(returncode=done.returncode, tail=done.stdout[-2000:])
    junit.unlink(missing_ok=True)
    return result


def paper_pair_bf16() -> Ensemble:
    """The paper's pair in shape (scripts/make_paper_pair.py) in bfloat16, on the GPU if there is one."""
    root = make_paper_pair.cached()
    return Ensemble.from_config(
        [ModelConfig(name=n, path=str(root / n), dtype="bfloat16") for n in make_paper_pair.DEFAULT]
    )


def exact_batching(prompts: int, data_dir: Path) -> dict:
    """bench_decode's section 7 on the paper's pair in shape, bfloat16: how each model's passes run on this device
    (its backend's record: on a GPU, which kernels keep a row's bits; adafuse/backend/) and what exactness costs
    at batch 8."""
    pair = paper_pair_bf16()
    report = compare_exact_batching(pair, data_dir, "nq", prompts)
    report["passes"] = dict(zip([m.name for m in pair.members], pair.passes(exact=True)))
    return report


def shaped_pair_batching(prompts: int, budget: int, data_dir: Path) -> dict:
    names = make_paper_pair.DEFAULT
    pair = paper_pair_bf16()
    requests = [replace(r, trace=True) for r in task_requests("nq", prompts, data_dir, budget)]
    report = {"prompts": len(requests), "budget": budget, "models": list(names), "runs": {}}
    for name, (method, cfg) in {
        "single_llama": ("single", SingleConfig(0)),
        "single_mistral": ("single", SingleConfig(1)),
        "adafuse": ("adafuse", AdaFuseConfig()),
    }.items():
        spec = METHODS[method]

        def one(members, i):
            return spec.generate(members, requests[i], cfg)  # noqa: B023

        started = time.perf_counter()
        alone = [drive(one(pair.members, i)) for i in range(len(requests))]
        row = {"batch_1_seconds": time.perf_counter() - started}
        for exact in (True, False):
            executor = Executor(exact=exact)
            started = time.perf_counter()
            batched = dict(decode_many(pair.members, range(len(requests)), one, 8, executor))
            label = "exact" if exact else "not_exact"
            row[f"batch_8_{label}_seconds"] = time.perf_counter() - started
            row[f"batch_8_{label}_identical"] = sum(batched[i].text == alone[i].text for i in range(len(requests)))
            if method == "single":
                row[f"batch_8_{label}_bitwise_logprobs"] = sum(
                    [s.logprob for s in batched[i].trace.steps] == [s.logprob for s in alone[i].trace.steps]
                    for i in range(len(requests))
                )
            row[f"batch_8_{label}_how"] = executor.report()
        report["runs"][name] = row
        print(f"  {name}: {row}", flush=True)
    return report


def bench_sections(out: Path, dry_run: bool, seconds: float) -> dict:
    sections = {}
    scale = "0.05" if dry_run else "0.25"
    # a dry run checks the script, not the figures: one prompt of one task per section
    tasks = ["--tasks", "nq"] if dry_run else []
    batching_task = ["--batching-task", "nq"] if dry_run else []
    for section, extra in [("singles", tasks), ("batching", ["--batch-sizes", "1", "8", *batching_task])]:
        target = out.parent / f"gpu_check_{section}.json"
        only = ["--only", section, "--scale", scale, "--out", str(target)]
        command = [sys.executable, "-m", "tools.bench_decode", *only]
        started = time.perf_counter()
        done = subprocess.run([*command, *extra], cwd=ROOT, capture_output=True, text=True, timeout=seconds)
        seconds -= time.perf_counter() - started
        sections[section] = json.loads(target.read_text()) if target.is_file() else {"error": done.stderr[-2000:]}
        target.unlink(missing_ok=True)
    return sections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every step at its smallest, on any device")
    parser.add_argument("--full", action="store_true", help="the paper's pair on the user's path (tools/gpu_full.py)")
    parser.add_argument("--limit", type=float, help="seconds for the whole check (480; a dry run: more)")
    parser.add_argument("--data-dir", type=Path, default=SHARED_DATA)
    parser.add_argument("--out", type=Path, help="the JSON (results/bench/gpu_check.json; --full: gpu_full.json)")
    full = parser.add_argument_group("--full")
    full.add_argument("--layers", type=int, help=f"layers of each model at the real width ({gpu_full.REAL_LAYERS})")
    full.add_argument("--prompts", type=int, help=f"NQ prompts ({gpu_full.FULL.prompts['nq'][0]}; twice at batch 32)")
    full.add_argument("--budget", type=int, help=f"NQ's new tokens per prompt ({gpu_full.FULL.prompts['nq'][1]})")
    full.add_argument("--work", type=Path, help="where the pair and the runs go, kept (default: a temporary folder)")
    full.add_argument("--logs", type=Path, help="a folder for a copy of each child process's log")
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run on a GPU machine, or use --dry-run to check the script")
    if args.full:
        out = args.out or ROOT / "results/bench/gpu_full.json"
        figures = (args.limit, args.layers, args.prompts, args.budget)
        gpu_full.check(out, args.data_dir, args.dry_run, *figures, args.work, args.logs)
        print(f"written to {out}")
        return
    out = args.out or ROOT / "results/bench/gpu_check.json"
    record = StepRecord(out, args.limit or (3600.0 if args.dry_run else 480.0), {"environment": environment()})
    record.record["dry_run"] = args.dry_run
    record.step("reference_tests", lambda left: reference_tests(out, args.dry_run, left))
    prompts, budget = (2, 4) if args.dry_run else (24, 32)
    record.step("shaped_pair_bf16", lambda left: shaped_pair_batching(prompts, budget, args.data_dir))
    record.step("exact_batching", lambda left: exact_batching(4 if args.dry_run else 48, args.data_dir))
    record.step("bench_decode", lambda left: bench_sections(out, args.dry_run, left))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
