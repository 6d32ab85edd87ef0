"""The paper's ablation figures from the runs below a results directory: a PNG and the CSV behind it each.

    python scripts/make_figures.py results/grid_llama_mistral   # writes results/grid_llama_mistral/figures/*

    tau.png              accuracy vs τΔ, one line per task          (run.py -m method.tau=0.1,0.3,0.5,0.9)
    branches.png         accuracy vs B, the paper's Figure 4        (run.py -m method.branches=1,2,4,5)
    max_words.png        accuracy vs M                              (run.py -m method.max_words=1,2,4)
    fixed_words.png      adaptive vs fixed-length commitment, Figure 2  (run.py -m method.fixed_words=1,2,3)
    diversity.png        distinct first tokens vs a word-level beam search for the B branches, Figure 7
                                                                    (run.py method.diversity=false)
    words_per_round.png  words committed per round by task, Figure 3 (AdaFuse's default runs)
    runtime.png          seconds per example by method, Figure 5    (each method's default run)

A sweep of one knob is the AdaFuse runs whose other knobs are the defaults and whose run id holds
nothing but method settings; the default run (τΔ 0.7, B 3, M 3, adaptive, distinct first tokens) is every
sweep's middle point, so a sweep leaves it out (scripts/run_grid.py does). The points of a sweep are scored on
the examples all of them decoded (a default run over Table 1's 100 examples beside sweep points over the first
50 counts its first 50), and the CSV's n says how many. Accuracy is each task's primary metric (--metric paper:
its paper_* replica), with bootstrap standard errors. Every task of the results is drawn, the paper's six in the
paper's order and any other after them. The runtime figure states the batch size its runs decoded at: a run's
seconds per example are its decoding time over its examples, and at a batch size above 1 examples overlap, so a
bar is what an example costs in a batch, not how long one takes alone (the paper's Figure 5, at batch size 1).
A figure the results hold no runs for is skipped, with a line in the log.
"""

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from adafuse.config import AdaFuseConfig
from eval.bootstrap import RESAMPLES, standard_error, value_on
from eval.collect import NAMED_KNOBS, Run, runs_of_pair, shared_by_task, shared_settings

ROOT = Path(__file__).resolve().parent.parent

log = logging.getLogger("make_figures")

TASKS = {
    "nq": "NQ",
    "squad": "SQuAD",
    "triviaqa": "TriviaQA",
    "gsm8k": "GSM8K",
    "flores_en_de": "En→De",
    "flores_de_en": "De→En",
}
DEFAULTS = asdict(AdaFuseConfig())
KNOBS = {"tau": "τΔ", "branches": "B (branches)", "max_words": "M (max words per round)"}
BRANCHING = {True: "distinct first tokens", False: "word-level beam search"}  # diversity's two values, as named


def task_order(tasks) -> list[str]:
    """The paper's six in its column order, then any other task, by name."""
    present = set(tasks)
    return [t for t in TASKS if t in present] + sorted(present - set(TASKS))


def own_overrides(run: Run, shared: dict[str, list[str]]) -> list[str]:
    return [o for o in run.overrides if o not in shared[run.task]]


def varies_only(run: Run, knob: str, shared: dict[str, list[str]]) -> bool:
    """An AdaFuse run whose knobs are the defaults except `knob`, and whose run id sets nothing else
    (but what every run shares)."""
    if run.method != "adafuse" or not all(o.startswith("method.") for o in own_overrides(run, shared)):
        return False
    return all(run.metrics["method"].get(k) == v for k, v in DEFAULTS.items() if k != knob)


def on_shared_examples(points: list[tuple[Run, dict]], kind: str, resamples: int) -> list[dict]:
    """One row per (run, columns): the run's accuracy on the examples that every run of its task scored."""
    rows = []
    for task in task_order(r.task for r, _ in points):
        runs = [(r, columns) for r, columns in points if r.task == task]
        common = set.intersection(*(set(r.ids) for r, _ in runs))
        ids = [i for i in runs[0][0].ids if i in common]
        for run, columns in runs:
            name = run.metric_name(kind)
            value, se = value_on(run, name, ids), standard_error(run, name, resamples, ids)
            rows.append({"task": task} | columns | {"n": len(ids), "metric": name, "value": value, "se": se})
    return rows


# ---- one function per figure: (the CSV's rows, a function that draws them) ------------------------


def knob_sweep(runs: list[Run], knob: str, kind: str, resamples: int, shared: dict[str, list[str]]) -> pd.DataFrame:
    points = [(r, {knob: r.metrics["method"][knob]}) for r in runs if varies_only(r, knob, shared)]
    rows = on_shared_examples(points, kind, resamples)
    return _swept(pd.DataFrame(rows), knob).sort_values(["task", knob]) if rows else pd.DataFrame()


def draw_knob(frame: pd.DataFrame, knob: str, ax) -> None:
    for task, lines in frame.groupby("task", sort=False):
        ax.errorbar(lines[knob], lines["value"], yerr=lines["se"], marker="o", capsize=3, label=TASKS.get(task, task))
    ax.set_xlabel(KNOBS[knob])
    ax.set_ylabel(_metric_label(frame))
    ax.legend()


def _metric_label(frame: pd.DataFrame) -> str:
    return f"{'/'.join(sorted(frame['metric'].unique()))} (± bootstrap SE)"


def fixed_words(runs: list[Run], kind: str, resamples: int, shared: dict[str, list[str]]) -> pd.DataFrame:
    points = []
    for r in runs:
        if varies_only(r, "fixed_words", shared):
            k = r.metrics["method"]["fixed_words"]
            points.append((r, {"commitment": "adaptive" if k is None else f"fixed {k}"}))
    rows = on_shared_examples(points, kind, resamples)
    return _swept(pd.DataFrame(rows), "commitment").sort_values(["task", "commitment"]) if rows else pd.DataFrame()


def diversity(runs: list[Run], kind: str, resamples: int, shared: dict[str, list[str]]) -> pd.DataFrame:
    points = [
        (r, {"branches from": BRANCHING[r.metrics["method"]["diversity"]]})
        for r in runs
        if varies_only(r, "diversity", shared)
    ]
    rows = on_shared_examples(points, kind, resamples)
    return _swept(pd.DataFrame(rows), "branches from") if rows else pd.DataFrame()


def _swept(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """The tasks with at least two values of `column`: a default run alone is no sweep."""
    return frame[frame.groupby("task")[column].transform("nunique") >= 2]


def draw_bars(frame: pd.DataFrame, group: str, value: str, ax, ylabel: str, err: str | None = None) -> None:
    """Grouped bars: one group per task, one bar per value of `group`."""
    order = task_order(frame["task"])
    table = frame.pivot_table(index="task", columns=group, values=value, sort=False).reindex(order)
    errors = frame.pivot_table(index="task", columns=group, values=err, sort=False).reindex(order) if err else None
    table.index = [TASKS.get(t, t) for t in table.index]
    if errors is not None:
        errors.index = table.index
    table.plot.bar(ax=ax, yerr=errors, capsize=2, rot=0)
    ax.legend(title=group, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # beside, never on, a bar
    ax.set_xlabel("")
    ax.set_ylabel(ylabel)


def words_per_round(runs: list[Run], shared: dict[str, list[str]]) -> pd.DataFrame:
    rows = [
        {"task": r.task, "words": int(words), "fraction": fraction}
        for r in runs
        if r.method == "adafuse" and not own_overrides(r, shared)
        for words, fraction in r.metrics["throughput"]["words_per_round"].items()
    ]
    return pd.DataFrame(rows)


def method_label(run: Run) -> str:
    """A single model by its name, a method by its name and the knob that says which variant ran."""
    if run.method == "single":
        return run.metrics["models"][0]
    knob = NAMED_KNOBS.get(run.method)
    return f"{run.method} ({knob} {run.metrics['method'][knob]})" if knob else run.method


def runtime(runs: list[Run], shared: dict[str, list[str]], tasks: list[str] | None) -> pd.DataFrame:
    """Each method's default run's seconds per example, with the commit that timed it and the batch size it
    decoded at: a timing is the engine's of that commit at that batch size, and the figure's title names them."""
    rows = [
        {
            "task": r.task,
            "method": method_label(r),
            "seconds_per_example": r.metrics["throughput"]["seconds_per_example"],
            "n": r.metrics["n"],
            "git_sha": r.metrics.get("environment", {}).get("git_sha") or "unknown",
            "batch_size": r.config.get("batch_size", 1),  # runs from before batching decoded one at a time
        }
        for r in runs
        if all(o.startswith("method.member=") for o in own_overrides(r, shared))  # each method's default run
        and (tasks is None or r.task in tasks)
    ]
    return pd.DataFrame(rows)


def draw_runtime(frame: pd.DataFrame, ax) -> None:
    if frame["batch_size"].nunique() > 1:  # bars of several batch sizes: each says its own
        frame = frame.assign(method=frame["method"] + " (batch " + frame["batch_size"].astype(str) + ")")
    draw_bars(frame, "method", "seconds_per_example", ax, "seconds per example")


def figures(runs: list[Run], kind: str, resamples: int, runtime_tasks: list[str] | None = None) -> dict:
    """{name: (frame, draw(frame, ax), title)} for every figure."""
    shared = shared_by_task(runs)
    out = {}
    for knob in KNOBS:
        out[knob] = (
            knob_sweep(runs, knob, kind, resamples, shared),
            lambda f, ax, knob=knob: draw_knob(f, knob, ax),
            f"Accuracy vs {KNOBS[knob]}",
        )
    out["fixed_words"] = (
        fixed_words(runs, kind, resamples, shared),
        lambda f, ax: draw_bars(f, "commitment", "value", ax, _metric_label(f), err="se"),
        "Adaptive vs fixed-length commitment (Figure 2)",
    )
    out["words_per_round"] = (
        words_per_round(runs, shared),
        lambda f, ax: draw_bars(f, "words", "fraction", ax, "fraction of rounds"),
        "Words committed per round (Figure 3)",
    )
    out["diversity"] = (
        diversity(runs, kind, resamples, shared),
        lambda f, ax: draw_bars(f, "branches from", "value", ax, _metric_label(f), err="se"),
        "Branches: distinct first tokens vs word beam search (Figure 7)",
    )
    timed = runtime(runs, shared, runtime_tasks)
    commits = ", ".join(sha[:7] for sha in sorted(set(timed["git_sha"]))) if not timed.empty else ""
    sizes = sorted(set(timed["batch_size"])) if not timed.empty else []
    out["runtime"] = (
        timed,
        draw_runtime,
        f"Seconds per example (Figure 5), timed at commit {commits}, "
        + (f"batch size {sizes[0]}" if len(sizes) == 1 else "each bar's batch size in its name"),
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--metric", choices=["standard", "paper"], default="standard")
    parser.add_argument("--pair", help="the model pair to plot, where the results hold several")
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    parser.add_argument("--out", type=Path, help="folder for the figures (default: RESULTS_DIR/figures)")
    parser.add_argument(
        "--runtime-tasks",
        help="comma-separated tasks for runtime.png (default: all)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    runs, pair = runs_of_pair(args.results_dir, args.pair)
    runtime_tasks = args.runtime_tasks.split(",") if args.runtime_tasks else None
    out = args.out or args.results_dir / "figures"
    out.mkdir(parents=True, exist_ok=True)
    for name, (frame, draw, title) in figures(runs, args.metric, args.resamples, runtime_tasks).items():
        if frame.empty:
            log.info("%s: skipped, the results hold no runs for it", name)
            continue
        frame.to_csv(out / f"{name}.csv", index=False)
        fig, ax = plt.subplots(figsize=(8.5, 4.5))
        draw(frame, ax)
        settings = ", ".join(shared_settings(runs))
        ax.set_title(f"{title}, {pair} pair" + (f"\n(every run: {settings})" if settings else ""))
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=120)
        plt.close(fig)
        log.info("%s: wrote %s.png and %s.csv in %s", name, name, name, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
