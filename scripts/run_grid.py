"""Table 1 and the ablations of the paper for one model pair, in one command: the plan, the models fetched once,
every run as a job, then the tables and the figures from the runs it wrote.

    python scripts/run_grid.py model_pair=llama_mistral --dry-run                  # the plan alone: nothing runs
    python scripts/run_grid.py model_pair=llama_mistral hydra.launcher.partition=gpu   # SLURM, a GPU node per run
    python scripts/run_grid.py --launcher slurm_cpu --grid cpu                     # the bundled pair on CPU nodes
    python scripts/run_grid.py --launcher process --limit 20 model_pair=llama_mistral   # no cluster: on this machine
    python scripts/run_grid.py --parts ablations --limit 200 model_pair=llama_mistral   # the ablations alone

What runs: conf/grid/<--grid>.yaml (default `paper`: every example of the six tasks; `cpu`: the slices of
results/grid), for the pair and settings of the command line (run.py's overrides, the same for every run: a
setting that can change a prediction enters every run id). First the plan: each multirun, each run's directory
and what it holds, and the hours left where runs of the same task and method on this pair have measured them.
Then, unless --dry-run: scripts/prepare_models.py fetches the pair (and PairRM, for protocol=paper's
LLM-Blender) into the Hugging Face cache; the jobs read it offline (HF_HUB_OFFLINE=1). Each multirun is run by
`run.py -m`, all at once through the SLURM launchers, one after the other on this machine with `process`.
A progress bar counts finished runs. Last, scripts/make_table.py (standard metrics; paper_* beside the paper's
rows) and scripts/make_figures.py read the results folder for this pair.

Rerunning the command resumes: a finished run is left out, a started one resumes from its predictions.
Results go to results_dir (default here: results/grid_<pair>); each multirun's records and log to
multirun/grid/<date>/<time>/.
"""

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf
from tqdm import tqdm

from adafuse.errors import AdaFuseError
from conf.compose import compose_run
from eval.grid import PARTS, Run, Sweep, check_command_line, estimate, load_grid, plan, read_state, sweeps

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("run_grid")

# The launchers, by the overrides they add to every run.
LAUNCHERS = {
    "slurm": ["hydra/launcher=slurm", "progress=false"],  # conf/hydra/launcher/slurm.yaml: a GPU per job
    "slurm_cpu": ["hydra/launcher=slurm_cpu", "threads=1", "progress=false"],  # a core per job
    "process": [],  # Hydra's basic launcher: a multirun's runs in one process, the pair loaded once for them
}
POLL_S = 10  # how often the progress bar reads the run directories while jobs run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="run.py's overrides for every run (model_pair=..., hydra.*)")
    parser.add_argument(
        "--grid", default="paper", help="grid/<name>.yaml of conf/ or of hydra.searchpath's folders (default: paper)"
    )
    parser.add_argument("--launcher", choices=list(LAUNCHERS), default="slurm", help="default: slurm (GPU nodes)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--limit", type=int, help="score the first N examples of every task (default: the grid's)")
    parser.add_argument(
        "--pack",
        action="store_true",
        help="a SLURM job per multirun, not per run: its runs one after another, the pair loaded once (for slices "
        "small enough that loading costs more than decoding; raise hydra.launcher.timeout_min to match)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    args = parser.parse_intermixed_args(argv)  # overrides before and after the flags
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        parser.error(f"--parts: {', '.join(sorted(set(parts) - set(PARTS)))} is no part; the parts: {', '.join(PARTS)}")

    try:
        check_command_line(args.overrides)
        base = compose_run(*LAUNCHERS[args.launcher], *args.overrides, hydra=True)
        pair = base.model_pair.name
        if not any(o.split("=")[0] == "results_dir" for o in args.overrides):
            args.overrides.append(f"results_dir=results/grid_{pair}")
        command_line = [*LAUNCHERS[args.launcher], *args.overrides]
        grid = load_grid(args.grid, [o for o in args.overrides if o.startswith("hydra.searchpath=")])
        planned = plan(sweeps(grid, parts, len(base.model_pair.members), args.limit), command_line)
    except (AdaFuseError, HydraException) as err:
        sys.exit(f"run_grid: {err}")
    results = Path(compose_run(*command_line).results_dir).absolute()
    print_plan(planned, base, args.launcher, pair, results, args.pack)
    if args.dry_run:
        return 0

    if args.launcher != "process" and shutil.which("sbatch") is None:
        sys.exit("run_grid: no SLURM here (sbatch is not on PATH); run with --launcher process, or on the cluster")
    multiruns = [(s, overrides) for s in planned for overrides in s.multiruns() if not all(r.finished for r in s.runs)]
    runs = [r for s in planned for r in s.runs]
    failed = []
    if multiruns:
        prepare(args.overrides, grid, parts)
        os.environ["HF_HUB_OFFLINE"] = "1"  # the runs, and the jobs that inherit it, read the cache prepare filled
        stamp = time.strftime("%Y-%m-%d/%H-%M-%S")
        if args.launcher == "process":
            failed = run_here(multiruns, stamp)
        else:
            failed = run_on_cluster(multiruns, stamp, runs, args.pack)
    for run in runs:
        read_state(run)
    left = [r for r in runs if not r.finished]
    tables(results, pair, runs)
    if failed or left:
        log.error(
            "grid: %d multiruns failed, %d of %d runs unfinished; rerun the command to resume them",
            len(failed),
            len(left),
            len(runs),
        )
        return 1
    log.info("grid: every run finished; the tables and figures are in %s", results)
    return 0


def print_plan(planned: list[Sweep], base, launcher: str, pair: str, results: Path, pack: bool) -> None:
    runs = [r for s in planned for r in s.runs]
    models = ", ".join(f"{m.name} ({m.path or m.bundle})" for m in base.model_pair.members.values())
    print(f"Grid for model pair {pair}: {models}")
    settings = OmegaConf.select(base, "hydra.launcher") if launcher != "process" else None
    if settings is None:
        print("Launcher: process (Hydra's basic launcher): each multirun's runs in one process, one after the other")
    else:
        job = f"{settings.gpus_per_node or 0} GPU, {settings.cpus_per_task} CPUs, {settings.mem_gb} GB"
        print(
            f"Launcher: {launcher}, one SLURM job per {'multirun' if pack else 'run'}: {job}, "
            f"{settings.timeout_min} min, partition {settings.partition or 'the default'} (hydra.launcher.*)"
        )
    print(f"Results: {results}/<task>/<method>/{pair}/<run id>")
    for sweep in planned:
        left = [r for r in sweep.runs if not r.finished]
        own = sweep.overrides[: len(sweep.overrides) - len(sweep.command_line)]
        print(f"\n[{sweep.part}] run.py -m {' '.join(own)}: {len(sweep.runs)} runs, {len(left)} to run")
        for run in sweep.runs:
            state = "finished" if run.finished else f"{run.done}/{run.examples} examples"
            print(f"  {run.run_dir.relative_to(results)}  [{state}]")
    left = [r for r in runs if not r.finished]
    decode = sum(max(r.examples - r.done, 0) for r in left)
    print(f"\n{len(runs)} runs: {len(runs) - len(left)} finished, {len(left)} to run, {decode:,} examples to decode")
    device, per_job, unit = device_of(base, launcher)
    guess = estimate(runs, device, per_job)
    if guess.measured:
        print(
            f"Estimate: {guess.hours:,.1f} {unit} hours for the {guess.measured} runs left that have a measured rate "
            f"(seconds per example of runs of the same task and method on this pair on {device}, x {per_job} per job)"
            + (f"; {guess.unmeasured} runs have none yet" if guess.unmeasured else "")
        )
    elif left:
        print(f"Estimate: none yet; no run of this plan has decoded on {device} (rerun with --dry-run once some have)")


def device_of(base, launcher: str) -> tuple[str, int, str]:
    """(the device a job decodes on, how many a job holds, the unit of the hours)."""
    if launcher == "process":
        import torch

        gpus = torch.cuda.device_count()
        return ("cuda", gpus, "GPU") if gpus else ("cpu", torch.get_num_threads(), "CPU-core")
    settings = base.hydra.launcher
    if settings.gpus_per_node:
        return "cuda", settings.gpus_per_node, "GPU"
    return "cpu", settings.cpus_per_task, "CPU-core"


def prepare(overrides: list[str], grid, parts: list[str]) -> None:
    """The pair into the caches (scripts/prepare_models.py), and PairRM where protocol=paper's LLM-Blender ranks
    with it; exits if that fails, before any job is submitted."""
    extra = ["protocol=paper", "method=llm_blender"] if "paper" in parts and "llm_blender" in grid.paper.methods else []
    command = [sys.executable, str(ROOT / "scripts" / "prepare_models.py"), *overrides, *extra]
    if subprocess.run(command).returncode:
        sys.exit("run_grid: the models could not be prepared (above); nothing was submitted")


def run_here(multiruns: list[tuple[Sweep, list[str]]], stamp: str) -> list[str]:
    """Each multirun by `run.py -m` on this machine, one after the other, its runs in its one process (Hydra's basic
    launcher); the failed ones' overrides."""
    failed = []
    for i, (sweep, overrides) in enumerate(multiruns):
        log.info("grid: multirun %d of %d [%s]: %s", i + 1, len(multiruns), sweep.part, " ".join(overrides))
        command = [sys.executable, str(ROOT / "run.py"), "-m", f"hydra.sweep.dir=multirun/grid/{stamp}/{i}", *overrides]
        if subprocess.run(command).returncode:
            failed.append(" ".join(overrides))
    return failed


def run_on_cluster(multiruns: list[tuple[Sweep, list[str]]], stamp: str, runs: list[Run], pack: bool) -> list[str]:
    """Every multirun at once, each `run.py -m` submitting its jobs and waiting for them, its log in its sweep
    folder; or with `pack`, one job per multirun, all of them one multirun of eval/grid_job.py. A bar counts the
    finished runs meanwhile. The failed multiruns' overrides."""
    procs = []
    if pack:
        folder = Path("multirun/grid", stamp).absolute()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "plan.json").write_text(json.dumps([in_the_job(overrides) for _, overrides in multiruns], indent=1))
        launcher = [o for o in multiruns[0][1] if o not in in_the_job(multiruns[0][1])]
        jobs = ",".join(map(str, range(len(multiruns))))
        command = [sys.executable, "-m", "eval.grid_job", "-m", f"plan={folder / 'plan.json'}", f"index={jobs}"]
        command += [f"hydra.sweep.dir={folder / 'jobs'}", *launcher]
        with open(folder / "run_grid.log", "w") as out:
            procs.append(("every multirun", folder, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)))
        log.info("grid: %d jobs, one per multirun (%s): log in %s", len(multiruns), folder / "plan.json", folder)
    for i, (sweep, overrides) in enumerate([] if pack else multiruns):
        folder = Path("multirun/grid", stamp, str(i))
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, str(ROOT / "run.py"), "-m", f"hydra.sweep.dir={folder}", *overrides]
        with open(folder / "run_grid.log", "w") as out:
            procs.append((" ".join(overrides), folder, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)))
        log.info("grid: multirun %d [%s]: log in %s", i, sweep.part, folder / "run_grid.log")
    left = [r for r in runs if not r.finished]
    with tqdm(total=len(left), desc="grid: runs finished", unit="run") as bar:
        while any(p.poll() is None for _, _, p in procs):
            time.sleep(POLL_S)
            bar.update(sum(_finished(r) for r in left) - bar.n)
        bar.update(sum(_finished(r) for r in left) - bar.n)
    failed = []
    for own, folder, proc in procs:
        if proc.returncode:
            failed.append(" ".join(own))
            tail = (folder / "run_grid.log").read_text().splitlines()[-15:]
            log.error(
                "grid: multirun %s failed (exit %d); its log ends:\n%s", " ".join(own), proc.returncode, "\n".join(tail)
            )
    return failed


def in_the_job(overrides: list[str]) -> list[str]:
    """A packed multirun's overrides as its job runs it: without the launcher's, which chose the job itself."""
    return [o for o in overrides if not o.startswith(("hydra/launcher=", "hydra.launcher."))]


def _finished(run: Run) -> bool:
    read_state(run)
    return run.finished


def tables(results: Path, pair: str, runs: list[Run]) -> None:
    """Table 1 (standard metrics; the paper_* replicas beside the paper's rows, where a task has them) and the
    figures of this pair's runs."""
    scored = [json.loads((r.run_dir / "metrics.json").read_text()) for r in runs if r.finished]
    replicas = any(name.startswith("paper_") for m in scored for name in m["metrics"])
    for script, extra in [
        ("make_table", []),
        *([("make_table", ["--metric", "paper", "--paper"])] if replicas else []),
        ("make_figures", []),
    ]:
        command = [sys.executable, str(ROOT / "scripts" / f"{script}.py"), str(results), "--pair", pair, *extra]
        done = subprocess.run(command)
        if done.returncode:
            log.error("grid: %s exited %d", " ".join(command[1:]), done.returncode)


if __name__ == "__main__":
    sys.exit(main())
