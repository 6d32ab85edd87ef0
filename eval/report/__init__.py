"""An HTML report of one run, or of several runs side by side (`python -m eval.report RUN_DIR ... -o FILE`).

The page is one static file: the data below is embedded as JSON next to the page's CSS and JS (this
package's page.html, report.css, report.js), so it opens from file:// with no server and no network.
Everything the page shows is computed here, in Python, except what depends on the reader's choices
(filters, sorting, which two runs to compare); the unit tests read the payload this module builds.

Payload, per run: its settings, metrics with bootstrap standard errors, throughput, and the command that
reruns it with trace=true. Per example (aligned by id across runs): the query, references and, per run,
the prediction, scores, statistics and a view of its trace made for reading: AdaFuse's rounds (each
model's committed words and margins, the pool with every model's NLL, the fused score, the winner, the
text it appended and where the stop cut it), or the baselines' steps.
"""

import json
import math
import os
import shlex
from dataclasses import dataclass
from functools import cached_property
from importlib.resources import files
from pathlib import Path

from adafuse.errors import DataError
from eval.bootstrap import RESAMPLES, standard_error
from eval.collect import Run, read_config, read_metrics

# Throughput figures shown per run, in this order (metrics.json "throughput").
THROUGHPUT = ("seconds_per_example", "generated_tokens_per_second", "forward_passes", "rounds_per_example")


def open_run(path: Path) -> Run:
    """A finished run directory (metrics.json, config.yaml and predictions.jsonl)."""
    path = Path(path)
    for name in ("metrics.json", "config.yaml", "predictions.jsonl"):
        if not (path / name).is_file():
            raise DataError(
                f"{path} is not a finished run directory: it has no {name} "
                "(a run writes metrics.json once every example has a prediction; scripts/merge.py writes it for shards)"
            )
    metrics = read_metrics(path)
    if "ids" not in metrics:
        raise DataError(f"{path}/metrics.json does not list the scored examples: rerun the command to rewrite it")
    return Run(path, metrics, read_config(path))


@dataclass
class ReportRun:
    """One run as the report shows it."""

    run: Run

    @cached_property
    def primary(self) -> str:
        """The metric that decides right and wrong: the run's reported one (a paper_* replica under protocol=paper)."""
        name = self.run.metric_name("main")
        if name is None:
            raise DataError(f"{self.run.path}: the run reports no metric (its task has no references)")
        return name

    @cached_property
    def binary(self) -> bool:
        """Whether every per-example score of the primary metric is 0 or 1 (EM, accuracy): then right means 1."""
        return all(r["scores"][self.primary] in (0, 1) for r in self.run.records)

    @cached_property
    def by_id(self) -> dict[str, dict]:
        return dict(zip(self.run.ids, self.run.records))

    @property
    def has_trace(self) -> bool:
        return any("trace" in r for r in self.run.records)

    def score(self, example_id: str) -> float:
        return self.by_id[example_id]["scores"][self.primary]

    def label(self) -> str:
        m = self.run.metrics
        knobs = "" if self.run.run_id == "default" else f" [{self.run.run_id}]"
        return f"{m['method']['name']}{knobs} · {'+'.join(m['models'])}"

    def trace_command(self, example_ids: list[str] | None = None) -> str:
        """The command that decodes `example_ids` (default: every example) again with trace=true.

        The runner decodes the first task.limit examples of the task's canonical order, and a run's ids are
        that order, so the smallest limit that covers the ids is one past the last one's position."""
        position = {example_id: k for k, example_id in enumerate(self.run.ids)}
        wanted = self.run.ids if example_ids is None else example_ids
        limit = max(position[i] for i in wanted) + 1
        config = self.run.config
        words = ["python", "run.py", f"task={self.run.task}", f"method={self.run.method}"]
        words.append(f"model_pair={self.run.metrics['model_pair']}")
        words += self.run.overrides
        words += ["trace=true", f"task.limit={limit}"]
        if config.get("results_dir", "results") != "results":
            words.append(f"results_dir={config['results_dir']}")
        return shlex.join(words)


def pair_counts(a: ReportRun, b: ReportRun) -> dict[str, int]:
    """On the examples both runs scored: how often a's primary score beats b's (for EM: a right, b wrong),
    the reverse, ties, and how often the two predictions differ."""
    theirs = set(b.run.ids)
    shared = [i for i in a.run.ids if i in theirs]
    counts = {"shared": len(shared), "a_better": 0, "b_better": 0, "tie": 0, "differ": 0}
    for i in shared:
        sa, sb = a.score(i), b.score(i)
        counts["a_better" if sa > sb else "b_better" if sb > sa else "tie"] += 1
        counts["differ"] += a.by_id[i]["prediction"] != b.by_id[i]["prediction"]
    return counts


# ---- traces, as the page reads them ----------------------------------------------------------------------


def adafuse_rounds(trace: dict, prediction: str, stop_reason: str) -> list[dict]:
    """AdaFuse's rounds (adafuse/trace.py RoundTrace): per round each model's proposal, the pool with each
    model's NLL and token count, the fused score, the winner, the text it appended, and what the stop cut.

    The winner of the last rounds may run past a stop string: the prediction keeps the text before it, so
    a round appends what the prediction holds beyond the rounds before it, and the rest is what was cut."""
    rounds, text = [], ""
    for rnd in trace["rounds"]:
        winner = rnd["candidates"][rnd["winner"]]["text"]
        appended = winner if prediction.startswith(text + winner) else prediction[len(text) :]
        cut = winner[len(appended) :] if winner.startswith(appended) else winner
        rounds.append(
            {
                "round": rnd["round_idx"],
                "models": [
                    {
                        "committed": m["committed"],
                        "margins": m["margins"],
                        "branched": m["branched"],
                        "proposed": [j for j, c in enumerate(rnd["candidates"]) if k in c["proposers"]],
                    }
                    for k, m in enumerate(rnd["models"])
                ],
                "pool": [
                    {
                        "text": c["text"],
                        "eos": c["eos"],
                        "proposers": c["proposers"],
                        "words": c["words"],
                        "nll": [s["nll"] for s in c["scores"]],
                        "tokens": [len(s["ids"]) - s.get("skip", 0) for s in c["scores"]],
                        "fused": c["fused"],
                    }
                    for c in rnd["candidates"]
                ],
                "winner": rnd["winner"],
                "appended": appended,
                "cut": cut,
                "stop": None,
            }
        )
        text += appended
    if rounds:
        rounds[-1]["stop"] = stop_reason
    return rounds


def trace_view(method: str, record: dict) -> dict | None:
    """What the page draws for one example's trace: {"kind": ..., ...}; None without a trace."""
    trace = record.get("trace")
    if trace is None:
        return None
    stats = record["stats"]
    if trace.get("rounds"):
        return {"kind": "adafuse", "rounds": adafuse_rounds(trace, record["prediction"], stats["stop_reason"])}
    steps = trace.get("steps", [])
    if method == "sweetspan":
        spans = [
            {
                "round": step["round_idx"],
                "pool": [
                    {
                        "text": c["text"],
                        "eos": c["eos"],
                        "proposers": c["proposers"],
                        "nll": [s["nll"] for s in c["scores"]],
                        "kept": c["kept"],
                        "fused": c["score"],
                    }
                    for c in step["candidates"]
                ],
                "winner": step["winner"],
            }
            for step in steps
        ]
        return {"kind": "sweetspan", "rounds": spans}
    if method == "unite":
        return {"kind": "unite", "steps": steps}
    if method == "llm_blender":
        ranking = dict(steps[0]) if steps else {}
        ranking["nll"] = [[s["nll"] for s in row] for row in ranking.get("nll", [])]
        return {"kind": "llm_blender", "ranking": ranking}
    if method == "deepen":
        # The loss before the first optimiser step and before the last: how far the steps moved towards q.
        ends = [{**s, "loss": [s["loss"][0], s["loss"][-1]] if s["loss"] else []} for s in steps]
        return {"kind": "deepen", "steps": ends}
    if method == "single":
        return {"kind": "single", "steps": steps}
    return {"kind": "steps", "steps": steps}  # any other method: its records as they are


# ---- the payload and the page ----------------------------------------------------------------------------


def query_of(prompt: str) -> str:
    """The part of a few-shot prompt that is this example's: its last paragraph, less a last line that is
    only the answer's label ("Answer:", "German:")."""
    query = prompt.rstrip().rsplit("\n\n", 1)[-1]
    lines = query.split("\n")
    if len(lines) > 1 and lines[-1].endswith(":") and " " not in lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def standard_errors(run: Run, resamples: int) -> dict[str, dict]:
    """Each metric with its bootstrap standard error over `resamples` resamples (eval/bootstrap.py)."""
    out = {}
    for name, value in run.metrics["metrics"].items():
        registered = run.config["task"]["metrics"].get(name)
        if registered is None:  # a metric the task no longer lists: no scorer to resample
            out[name] = {"value": value, "se": None, "resamples": 0}
            continue
        out[name] = {"value": value, "se": standard_error(run, name, resamples), "resamples": resamples}
    return out


def run_summary(rr: ReportRun, resamples: int) -> dict:
    run, m = rr.run, rr.run.metrics
    metrics = standard_errors(run, resamples)
    return {
        "label": rr.label(),
        "path": str(run.path),
        "task": run.task,
        "method": m["method"],
        "run_id": run.run_id,
        "protocol": run.protocol,
        "models": m["models"],
        "model_pair": m["model_pair"],
        "n": m["n"],
        "primary": rr.primary,
        "binary": rr.binary,
        "metrics": metrics,
        "throughput": {k: m["throughput"][k] for k in THROUGHPUT if k in m["throughput"]},
        "words_per_round": m["throughput"].get("words_per_round", {}),
        "created": m.get("created"),
        "git_sha": m.get("environment", {}).get("git_sha"),
        "has_trace": rr.has_trace,
        "trace_command": None if rr.has_trace else rr.trace_command(),
        "tau": m["method"].get("tau"),
    }


def build_payload(run_dirs: list[Path], resamples: int = RESAMPLES) -> dict:
    """Everything the page shows. Examples are the first run's, in its order; the other runs' predictions
    join them by id (an example another run did not score shows none for it)."""
    if not run_dirs:
        raise DataError("the report needs at least one run directory")
    runs = [ReportRun(open_run(p)) for p in run_dirs]
    tasks = sorted({r.run.task for r in runs})
    if len(tasks) > 1:
        raise DataError(f"runs side by side must be of one task (their examples align by id); got {', '.join(tasks)}")
    first = runs[0]
    prompts = [first.by_id[i]["prompt"] for i in first.run.ids]
    examples = []
    for example_id, prompt in zip(first.run.ids, prompts):
        record = first.by_id[example_id]
        per_run = []
        for rr in runs:
            theirs = rr.by_id.get(example_id)
            if theirs is None:
                per_run.append(None)
                continue
            stats = theirs["stats"]
            per_run.append(
                {
                    "prediction": theirs["prediction"],
                    "answer": theirs["answer"],
                    "scores": theirs["scores"],
                    "stop": stats["stop_reason"],
                    "rounds": stats["rounds"],
                    "seconds": stats.get("run_seconds", stats["seconds"]),
                    "trace": trace_view(rr.run.method, theirs),
                    "trace_command": None if "trace" in theirs else rr.trace_command([example_id]),
                }
            )
        examples.append(
            {
                "id": example_id,
                "query": query_of(prompt),
                "prompt": prompt,
                "references": record["references"],
                "runs": per_run,
            }
        )
    # The few-shot part that every prompt shares is stored once.
    shared = os.path.commonprefix(prompts)
    shared = shared[: shared.rfind("\n\n") + 2] if "\n\n" in shared else ""
    for example in examples:
        example["prompt"] = example["prompt"][len(shared) :]
    return {
        "runs": [run_summary(r, resamples) for r in runs],
        "prompt_prefix": shared,
        "examples": examples,
    }


def finite(value):
    """`value` with every infinite or NaN float as its name ("inf", "-inf", "nan"): JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def render(payload: dict) -> str:
    """The page: page.html with the CSS, the JS and the payload inlined."""
    assets = files(__package__)
    data = json.dumps(finite(payload), ensure_ascii=False, allow_nan=False).replace("</", "<\\/")  # no early </script>
    return (
        assets.joinpath("page.html")
        .read_text()
        .replace("/*CSS*/", assets.joinpath("report.css").read_text())
        .replace("/*JS*/", assets.joinpath("report.js").read_text())
        .replace("/*DATA*/", data)
    )


def write_report(run_dirs: list[Path], out: Path, **resamples) -> Path:
    out = Path(out)
    out.write_text(render(build_payload(run_dirs, **resamples)), encoding="utf-8")
    return out
