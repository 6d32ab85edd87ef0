"""Table 1 from the runs below a results directory, as Markdown, LaTeX and CSV.

    python scripts/make_table.py results                    # standard metrics: EM, accuracy, BLEU
    python scripts/make_table.py results --metric paper     # the paper_* replicas of the authors' scorers
    python scripts/make_table.py results --paper            # plus the paper's published numbers
    python scripts/make_table.py results --sources          # plus what each run read: data and model commits

One row per single model, baseline and AdaFuse configuration (a run id other than `default` is part
of the row's name; LLM-Blender's ranker and DeePEn's main member always are), one column per task (the paper's
six in its order, then any other task of the results, never left out), and the average over the paper's tasks.
protocol=paper runs (docs/protocol.md) come last and report their paper_* metric in every table, so that with
--paper they sit right above the paper's published rows.
Every cell is the metric ± its bootstrap standard error over examples. The gain rows compare AdaFuse
(run id `default`) with the best baseline and the best single model of each column, on the examples
both scored, with a paired bootstrap 95% interval. Column headers give the slice size n and the data variant when all
of a column's cells share them; otherwise every cell gives its own.

Writes table1.md, table1.tex and table1.csv (table1_paper.* with --metric paper) into --out
(default: RESULTS_DIR). The CSV is long-form: one line per cell or gain, numbers unrounded. With --sources,
table1_sources.md too: one line per run of the table, its data (each hub split at its commit, or each
local file's sha256) and each model's commit (hub) or sha256 (GGUF), as its metrics.json records them.
"""

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from eval.bootstrap import RESAMPLES, Gain, paired_gain, standard_error
from eval.collect import NAMED_KNOBS, Run, runs_of_pair, shared_by_task, shared_settings
from eval.metrics import METRICS

ROOT = Path(__file__).resolve().parent.parent

log = logging.getLogger("make_table")

TASKS = {  # column order and names as in the paper
    "nq": "NQ",
    "squad": "SQuAD",
    "triviaqa": "TriviaQA",
    "gsm8k": "GSM8K",
    "flores_en_de": "En→De",
    "flores_de_en": "De→En",
}
BASELINES = ["llm_blender", "deepen", "sweetspan", "unite"]  # the paper's row order; others follow
AVERAGE = "Avg"

# The paper's Table 1 (arXiv 2601.06022, figures/Results.png; ../shared/research/adafuse.md §8):
# 7-8B models on GPUs, the authors' lenient scorers (EM, accuracy, spBLEU), full test sets.
PAPER = {
    "Mistral-7B-Instruct-v0.3": [32.05, 83.49, 77.27, 61.71, 29.99, 40.64, 54.19],
    "LLaMA-3.1-8B-Instruct": [34.24, 80.13, 78.97, 81.05, 31.33, 41.78, 57.92],
    "Qwen3-8B": [23.85, 76.72, 64.72, 89.99, 17.45, 36.95, 51.61],
    "InternLM3-8B-Instruct": [27.15, 81.77, 65.38, 76.72, 28.17, 37.37, 52.76],
    "LLM-Blender (ranker: PairRM, as upstream)": [36.56, 82.13, 75.58, 62.55, 34.45, 41.56, 54.97],
    "DeePEn": [37.42, 71.51, 73.85, 67.63, 37.56, 42.33, 55.05],
    "SweetSpan": [37.59, 86.58, 80.75, 63.38, 33.74, 42.85, 59.16],
    "UniTE": [38.95, 82.17, 81.38, 64.59, 34.98, 41.67, 57.29],
    "AdaFuse (Top-2 base, oracle)": [42.85, 90.38, 82.17, 90.25, 39.83, 45.25, 65.12],
    "AdaFuse (LLaMA+Mistral)": [42.85, 90.15, 82.17, 79.15, 39.83, 45.25, 63.23],
    "rel. gain vs best baseline (%)": [10.01, 4.12, 0.97, 17.03, 6.04, 5.60, 6.88],
}


@dataclass
class Cell:
    run: Run
    metric: str  # the reported name, e.g. em or paper_em
    value: float
    se: float

    @property
    def slice(self) -> tuple[int, str]:
        return self.run.metrics["n"], self.run.metrics["variant"]


KINDS = ("single", "baseline", "adafuse", "protocol")  # row order; protocol: protocol=paper runs, last


def row_of(run: Run, shared: dict[str, list[str]]) -> tuple[str, str]:
    """(kind, name) of the run's row: single rows are named by their model, others by their method; the
    run's overrides follow, less those every run shares, and the knobs of NAMED_KNOBS. protocol=paper runs
    are a kind of their own, single models' too: they sit beside the paper's rows, are scored by the paper_*
    replicas, and are no one's "best baseline" or "best single model"."""
    extra = [o for o in run.overrides if o not in shared[run.task]]
    if run.method == "single":
        extra = [o for o in extra if not o.startswith("method.member=")]
        kind = "protocol" if run.protocol == "paper" else "single"
        return kind, run.metrics["models"][0] + (f" [{','.join(extra)}]" if extra else "")
    knob = NAMED_KNOBS.get(run.method)
    if knob and not any(o.startswith(f"method.{knob}=") for o in extra):
        extra.append(f"method.{knob}={run.metrics['method'][knob]}")
    if run.protocol == "paper":
        kind = "protocol"
    else:
        kind = "adafuse" if run.method in ("adafuse", "adafuse_code") else "baseline"
    return kind, run.method + (f" [{','.join(extra)}]" if extra else "")


def collect(runs: list[Run], kind: str, resamples: int) -> dict[tuple[str, str], dict[str, Cell]]:
    """{(kind, row name): {task: Cell}}; two runs for one cell are an error, never an average."""
    rows: dict[tuple[str, str], dict[str, Cell]] = {}
    shared = shared_by_task(runs)
    for run in runs:
        name = run.metric_name(kind)
        if name is None:
            log.info("%s: skipped (task %s, no %s metric)", run.path, run.task, kind)
            continue
        row = row_of(run, shared)
        cells = rows.setdefault(row, {})
        if run.task in cells:
            raise SystemExit(
                f"two runs for row {row[1]!r}, task {run.task}: {cells[run.task].run.path} and {run.path}; "
                "point make_table.py at a directory that holds one of them"
            )
        cells[run.task] = Cell(run, name, run.metrics["metrics"][name], standard_error(run, name, resamples))
    return rows


NOT_RECORDED = "not recorded"  # a run from before metrics.json recorded its BLEU tokenizers


def bleu_tokenizers(rows: dict) -> dict[str, str]:
    """{BLEU metric: the sacrebleu tokenizer of every cell that reports it}. The same text scores another BLEU
    under another tokenizer, so a table whose cells of one metric were tokenized differently is refused,
    naming the runs of each tokenizer."""
    by_metric: dict[str, dict[str, list[str]]] = {}
    for cells in rows.values():
        for cell in cells.values():
            if METRICS[cell.run.config["task"]["metrics"][cell.metric]].bleu_tokenizer is None:
                continue
            tokenizer = cell.run.metrics.get("bleu_tokenizers", {}).get(cell.metric, NOT_RECORDED)
            by_metric.setdefault(cell.metric, {}).setdefault(tokenizer, []).append(str(cell.run.path))
    for metric, runs in by_metric.items():
        if len(runs) > 1:
            raise SystemExit(
                f"{metric} was tokenized differently in these runs, so one table cannot compare them: "
                + "; ".join(f"{tokenizer}: {', '.join(paths)}" for tokenizer, paths in sorted(runs.items()))
                + ". Point make_table.py at runs scored alike."
            )
    return {metric: next(iter(runs)) for metric, runs in by_metric.items()}


def ordered(rows: dict) -> list[tuple[str, str]]:
    def key(row):
        kind, name = row
        method = next(iter(rows[row].values())).run.method
        rank = BASELINES.index(method) if method in BASELINES else len(BASELINES)
        # protocol=paper rows in the paper's order too: single models, baselines, AdaFuse
        group = (method != "single") + (method in ("adafuse", "adafuse_code")) if kind == "protocol" else 0
        return (KINDS.index(kind), group, method != "adafuse", rank, name)

    return sorted(rows, key=key)


def best(rows: dict, kind: str, task: str) -> Cell | None:
    cells = [cells[task] for (k, _), cells in rows.items() if k == kind and task in cells]
    return max(cells, key=lambda c: c.value, default=None)


def best_average(rows: dict, kind: str, tasks: list[str]) -> dict[str, Cell] | None:
    complete = [cells for (k, _), cells in rows.items() if k == kind and all(t in cells for t in tasks)]
    return max(complete, key=lambda cells: np.mean([cells[t].value for t in tasks]), default=None)


def columns(rows: dict) -> tuple[list[str], list[str]]:
    """The table's tasks (the paper's six in its order, then any other, by name) and those its average is over:
    the paper's, where the table has any, so that the average compares with the paper's; else every task."""
    present = {task for cells in rows.values() for task in cells}
    tasks = [t for t in TASKS if t in present] + sorted(present - set(TASKS))
    return tasks, [t for t in tasks if t in TASKS] or tasks


def gains(rows: dict, tasks: list[str], averaged: list[str], resamples: int) -> dict[str, dict[str, Gain | None]]:
    """{"vs best baseline": {task or Avg: Gain}, "vs best single model": ...} for AdaFuse's default run; the
    average's over the `averaged` tasks."""
    ours = rows.get(("adafuse", "adafuse"), {})
    out = {}
    for kind, label in (("baseline", "vs best baseline"), ("single", "vs best single model")):
        row: dict[str, Gain | None] = {}
        for task in tasks:
            other = best(rows, kind, task)
            if task in ours and other is not None:
                row[task] = paired_gain([(ours[task].run, other.run, ours[task].metric)], resamples)
        others = best_average(rows, kind, averaged)
        if others is not None and all(t in ours for t in averaged):
            row[AVERAGE] = paired_gain([(ours[t].run, others[t].run, ours[t].metric) for t in averaged], resamples)
        out[label] = row
    return out


# ---- rendering ------------------------------------------------------------------------------------


def uniform_slices(rows: dict, tasks: list[str]) -> dict[str, tuple[int, str] | None]:
    """Per task, the (n, variant) every cell of its column shares, or None where they differ."""
    out = {}
    for task in tasks:
        slices = {cells[task].slice for cells in rows.values() if task in cells}
        out[task] = slices.pop() if len(slices) == 1 else None
    return out


def cell_text(cell: Cell, shared: tuple[int, str] | None) -> str:
    text = f"{cell.value:.1f} ± {cell.se:.1f}"
    if shared is None:
        n, variant = cell.slice
        text += f" (n={n}, {variant})"
    return text


def average_text(cells: dict[str, Cell], tasks: list[str]) -> str:
    if not all(t in cells for t in tasks):
        return ""
    value = np.mean([cells[t].value for t in tasks])
    se = np.sqrt(sum(cells[t].se ** 2 for t in tasks)) / len(tasks)  # tasks are independent samples
    return f"{value:.1f} ± {se:.1f}"


def gain_text(gain: Gain | None, relative: bool) -> str:
    if gain is None:
        return ""
    if relative:
        if gain.relative is None:
            return "n/a (best is 0)"
        if gain.relative_ci is None:
            return f"{gain.relative:+.1f}% [no interval: best is 0 in some resamples]"
        return f"{gain.relative:+.1f}% [{gain.relative_ci[0]:+.1f}, {gain.relative_ci[1]:+.1f}]"
    return f"{gain.points:+.1f} [{gain.points_ci[0]:+.1f}, {gain.points_ci[1]:+.1f}]"


def frame(
    rows: dict, tasks: list[str], averaged: list[str], gain_rows: dict, with_paper: bool, settings: dict | None = None
) -> pd.DataFrame:
    """The table as strings: one line per row, one column per task + Avg (over the `averaged` tasks). A column's
    header names the task, the settings every run of it has beside those of every run (`settings`, e.g. the file
    of a task of your own) and the slice all its cells share."""
    shared = uniform_slices(rows, tasks)
    header = {}
    for t in tasks:
        own = (settings or {}).get(t)
        header[t] = TASKS.get(t, t) + (f" [{', '.join(own)}]" if own else "")
        header[t] += f" (n={shared[t][0]}, {shared[t][1]})" if shared[t] else ""
    lines = {}

    def add(row: tuple[str, str]) -> None:
        cells = rows[row]
        lines[row[1]] = {header[t]: cell_text(cells[t], shared[t]) if t in cells else "" for t in tasks}
        lines[row[1]][AVERAGE] = average_text(cells, averaged)

    for row in ordered(rows):
        if row[0] != "protocol":
            add(row)
    for label, row in gain_rows.items():
        if not row:  # no baseline (or no single model) in the results
            continue
        for relative in (True, False):
            name = f"AdaFuse gain {label} ({'%' if relative else 'points'})"
            lines[name] = {header.get(t, t): gain_text(row.get(t), relative) for t in [*tasks, AVERAGE]}
    for row in ordered(rows):  # protocol=paper runs: after the gains, right above the paper's own rows
        if row[0] == "protocol":
            add(row)
    if with_paper:
        for name, values in PAPER.items():
            by_task = dict(zip([*TASKS, AVERAGE], values))  # a task of the user's own has no paper number
            lines[f"paper: {name}"] = {
                header.get(t, t): f"{by_task[t]:.2f}" if t in by_task else "" for t in [*tasks, AVERAGE]
            }
    return pd.DataFrame.from_dict(lines, orient="index").fillna("")


def long_form(rows: dict, gain_rows: dict) -> pd.DataFrame:
    """The numbers behind the table, unrounded: one line per cell and per gain."""
    lines = []
    for (kind, name), cells in rows.items():
        for task, c in cells.items():
            n, variant = c.slice
            lines.append(
                {"row": name, "kind": kind, "task": task, "metric": c.metric, "value": c.value, "se": c.se}
                | {"n": n, "variant": variant, "run_dir": str(c.run.path)}
            )
    for label, row in gain_rows.items():
        for task, g in row.items():
            if g is None:
                continue
            relative_ci = g.relative_ci or (None, None)
            lines.append(
                {"row": f"AdaFuse gain {label}", "kind": "gain", "task": task, "value": g.points, "n": g.n}
                | {"ci_low": g.points_ci[0], "ci_high": g.points_ci[1], "relative": g.relative}
                | {"relative_ci_low": relative_ci[0], "relative_ci_high": relative_ci[1]}
            )
    return pd.DataFrame(lines)


NOT_RECORDED_SOURCE = "not recorded"  # a run from before metrics.json recorded its source


def sources_frame(rows: dict) -> pd.DataFrame:
    """One line per run of the table: its row, task, data and models, each named by what pins it."""
    lines = []
    for (_, name), cells in rows.items():
        for task, cell in cells.items():
            source = cell.run.metrics.get("source")
            data, models = (NOT_RECORDED_SOURCE,) * 2
            if source:
                data = describe_data_source(source["data"])
                models = ", ".join(describe_model_source(m) for m in source["models"])
            lines.append({"row": name, "task": TASKS.get(task, task), "data": data, "models": models})
    return pd.DataFrame(lines)


def describe_data_source(data: dict) -> str:
    if data["hub"]:
        return ", ".join(f"{h['dataset']} {h['config'] or ''} {h['split']}@{h['commit'][:12]}" for h in data["hub"])
    return ", ".join(f"{name} (sha256 {digest[:12]})" for name, digest in data["files"].items())


def describe_model_source(model: dict) -> str:
    if "commit" in model:
        return f"{model['name']} {model['hub']}@{model['commit'][:12]}"
    if model.get("sha256"):
        return f"{model['name']} (sha256 {model['sha256'][:12]})"
    return f"{model['name']} {model['path']} (a local folder, not fingerprinted)"


def caption(
    kind: str,
    resamples: int,
    shared: list[str],
    protocol: bool = False,
    tokenizers: dict[str, str] | None = None,
    unaveraged: list[str] | None = None,
) -> str:
    scorer = "the paper_* replicas of the authors' lenient scorers" if kind == "paper" else "standard metrics"
    text = (
        f"Table 1 ({scorer}). Cells: metric ± bootstrap standard error over examples ({resamples} resamples). "
        "Gain rows: AdaFuse (default settings) minus the column's best baseline or single model on the examples "
        "both scored, [paired bootstrap 95% interval]; the paper's gain row is the relative one."
    )
    if protocol:
        text += (
            " Rows of protocol=paper runs (the paper's files, prompts, decoder and scorers) report the paper_* "
            "replicas in every table and enter no gain."
        )
    if unaveraged:
        text += f" Avg is over the paper's tasks; {', '.join(unaveraged)}, not among them, is not in it."
    recorded = {metric: t for metric, t in (tokenizers or {}).items() if t != NOT_RECORDED}
    if recorded:
        text += " BLEU tokenizers (sacrebleu): " + ", ".join(f"{m} {t}" for m, t in sorted(recorded.items())) + "."
    return text + (f" Every run: {', '.join(shared)}." if shared else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--metric", choices=["standard", "paper"], default="standard")
    parser.add_argument("--paper", action="store_true", help="add the paper's published numbers, in marked rows")
    parser.add_argument("--pair", help="the model pair to tabulate, where the results hold several")
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    parser.add_argument("--out", type=Path, help="folder for table1.{md,tex,csv} (default: RESULTS_DIR)")
    parser.add_argument(
        "--sources", action="store_true", help="also table1_sources.md: each run's data and model commits"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    runs, _ = runs_of_pair(args.results_dir, args.pair)
    if not runs:
        raise SystemExit(f"no metrics.json below {args.results_dir}")
    rows = collect(runs, args.metric, args.resamples)
    tokenizers = bleu_tokenizers(rows)
    tasks, averaged = columns(rows)
    everyone = shared_settings(runs)
    settings = {task: [o for o in own if o not in everyone] for task, own in shared_by_task(runs).items()}

    gain_rows = gains(rows, tasks, averaged, args.resamples)
    table = frame(rows, tasks, averaged, gain_rows, args.paper, settings)
    out = args.out or args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = "table1" if args.metric == "standard" else "table1_paper"
    protocol = any(kind == "protocol" for kind, _ in rows)
    unaveraged = [t for t in tasks if t not in averaged]
    text = caption(args.metric, args.resamples, everyone, protocol, tokenizers, unaveraged)
    (out / f"{stem}.md").write_text(f"{text}\n\n{table.to_markdown()}\n")
    latex = table.to_latex(caption=text, label="tab:table1", column_format="l" + "r" * len(table.columns), escape=True)
    (out / f"{stem}.tex").write_text(latex.replace("±", r"$\pm$").replace("→", r"$\to$"))
    long_form(rows, gain_rows).to_csv(out / f"{stem}.csv", index=False)
    print(table.to_markdown())
    log.info("wrote %s.{md,tex,csv} in %s", stem, out)
    if args.sources:
        sources = sources_frame(rows).to_markdown(index=False)
        (out / f"{stem}_sources.md").write_text(f"What each run read and loaded (metrics.json, source).\n\n{sources}\n")
        print(f"\n{sources}")
        log.info("wrote %s_sources.md in %s", stem, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
