"""Two finished runs of one task, example by example: are they on the same questions, how many predictions
differ, and each run's metrics, recomputed from its predictions.jsonl (and checked against its metrics.json).

    python scripts/compare_runs.py results/grid/nq/adafuse/tiny/default \
        "results/grid/nq/adafuse_code/tiny/protocol=paper"

Made for a default run beside its protocol=paper run (docs/protocol.md): the two read their
examples from different files (canonical and the paper's) with different prompts, so the examples are
matched by id and their inputs compared as text. A prediction "changes" when the answer its run's scorers
read differs: `answer` (the task's extraction) for the standard metrics, the authors' pred for paper_*.
Prints Markdown; --json prints the numbers.
"""

import argparse
import json
import sys
from pathlib import Path

from conf.schema import register, saved_config
from eval.paper_metrics import authors_pred
from eval.results import read_predictions
from eval.runner import settings_of
from eval.tasks import Task, _input_text, resolve_data_dir

ROOT = Path(__file__).resolve().parent.parent


def load(run_dir: Path) -> dict:
    """The run's task (its examples as the run read them), metrics.json and records in scored order."""
    settings = settings_of(saved_config(run_dir / "config.yaml"))
    settings.data.dir = resolve_data_dir(settings.data.dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    settings.task.limit = metrics["n"] if metrics.get("limit") is not None else None
    task = Task(settings.task, settings.data)
    by_id = read_predictions(run_dir / "predictions.jsonl")
    records = [by_id[i] for i in metrics["ids"]]
    recomputed = task.corpus_scores(records)
    for name, value in metrics["metrics"].items():
        if abs(recomputed[name] - value) > 1e-9:
            raise SystemExit(
                f"{run_dir}: {name} from predictions.jsonl is {recomputed[name]}, metrics.json has {value}"
            )
    inputs = {ex.id: _input_text(ex) for ex in task.examples}
    return {"path": str(run_dir), "task": task, "metrics": recomputed, "records": records, "inputs": inputs}


def compare(a: dict, b: dict) -> dict:
    ids = [r["id"] for r in a["records"] if r["id"] in {s["id"] for s in b["records"]}]
    ra, rb = ({r["id"]: r for r in run["records"]} for run in (a, b))
    same_input = [i for i in ids if a["inputs"][i] == b["inputs"][i]]
    same_refs = [i for i in ids if ra[i]["references"] == rb[i]["references"]]

    def scored(record: dict, paper: bool) -> str:
        return authors_pred(record["prediction"]) if paper else record["answer"]

    changed = {
        "prediction": sum(ra[i]["prediction"] != rb[i]["prediction"] for i in ids),
        "answer": sum(ra[i]["answer"] != rb[i]["answer"] for i in ids),
        "authors_pred": sum(scored(ra[i], True) != scored(rb[i], True) for i in ids),
    }
    flips = {}
    for name in sorted(set(a["metrics"]) & set(b["metrics"])):
        if all(name in ra[i]["scores"] and name in rb[i]["scores"] for i in ids):
            flips[name] = {
                "gained": sum(rb[i]["scores"][name] > ra[i]["scores"][name] for i in ids),
                "lost": sum(rb[i]["scores"][name] < ra[i]["scores"][name] for i in ids),
            }
    return {
        "runs": [a["path"], b["path"]],
        "n": [len(a["records"]), len(b["records"])],
        "shared_ids": len(ids),
        "same_input": len(same_input),
        "same_references": len(same_refs),
        "different_inputs": [(i, a["inputs"][i], b["inputs"][i]) for i in ids if i not in same_input][:5],
        "changed": changed,
        "metrics": [a["metrics"], b["metrics"]],
        "flips": flips,
    }


def markdown(c: dict) -> str:
    names = sorted(set(c["metrics"][0]) | set(c["metrics"][1]))
    lines = [
        f"A: `{c['runs'][0]}` (n={c['n'][0]}); B: `{c['runs'][1]}` (n={c['n'][1]}).",
        f"Shared example ids: {c['shared_ids']}; same question text: {c['same_input']}; "
        f"same references: {c['same_references']}.",
        f"Changed by B: raw generation {c['changed']['prediction']}, extracted answer {c['changed']['answer']}, "
        f"authors' pred {c['changed']['authors_pred']} of {c['shared_ids']}.",
        "",
        "| metric | A | B | B right, A wrong | A right, B wrong |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        va, vb = (m.get(name) for m in c["metrics"])
        flip = c["flips"].get(name, {})
        lines.append(
            f"| {name} | {'' if va is None else f'{va:.1f}'} | {'' if vb is None else f'{vb:.1f}'} "
            f"| {flip.get('gained', '')} | {flip.get('lost', '')} |"
        )
    for i, x, y in c["different_inputs"]:
        lines.append(f"\nDifferent inputs at {i}: {x!r} vs {y!r}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args()
    register()
    c = compare(load(args.run_a), load(args.run_b))
    print(json.dumps(c, indent=1) if args.json else markdown(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
