"""Our exact match against lm-evaluation-harness's stock `nq_open` and `triviaqa` scoring, on predictions the
runner wrote (docs/lm_eval.md has the findings):

    python -m eval.lm_scorers results/grid --out results/lm_eval/scorers.json

lm_eval's side is its own code and its own task files, as shipped: the stock generation stops (`until`:
newline, '.', ','; our runs stop at the newline only, so the prediction is cut where the stock task's
generation would have stopped), its filters (`remove_whitespace`, `take_first`) and its `exact_match`
with the task's arguments (case, punctuation, the article regex), correct if any gold alias matches.
Ours is the runner's: the first line, SQuAD's normalisation (lower case, no punctuation, no articles,
whitespace collapsed), any alias.

Each disagreement gets the first reason that explains it, checked by undoing that one difference:
`stop` (lm_eval agrees once its '.'/',' stops are not applied), `whitespace` (lm_eval agrees once runs of
whitespace collapse as ours do), `articles` (lm_eval agrees once articles are dropped as whole words in
any case, as ours do); `unexplained` otherwise.
"""

import argparse
import json
import re
from pathlib import Path

import lm_eval.tasks
import yaml
from lm_eval.api.registry import get_filter, get_metric

from eval.extract import extract
from eval.metrics import METRICS

STOCK_TASKS = {"nq": "nq_open/nq_open.yaml", "triviaqa": "triviaqa/default.yaml"}
METRIC_KEYS = ("metric", "aggregation", "higher_is_better")
_WHOLE_ARTICLES = re.compile(r"\b(a|an|the)\b", re.IGNORECASE)
REASONS = ("stop", "whitespace", "articles", "unexplained")


def stock_config(task: str) -> dict:
    """lm_eval's own task file, as installed."""
    return yaml.safe_load((Path(lm_eval.tasks.__file__).parent / STOCK_TASKS[task]).read_text())


class StockExactMatch:
    """lm_eval's scoring of one generation, step by step as its task file declares it."""

    def __init__(self, task: str):
        config = stock_config(task)
        self.until = config["generation_kwargs"]["until"]
        self.filters = [
            get_filter(step["function"])(**{k: v for k, v in step.items() if k != "function"})
            for step in config["filter_list"][0]["filter"]
        ]
        [metric] = config["metric_list"]
        self.metric = get_metric(metric["metric"])
        self.options = {k: v for k, v in metric.items() if k not in METRIC_KEYS}

    def stopped(self, generation: str) -> str:
        """The generation as the stock task's stop strings would have ended it."""
        for stop in self.until:
            generation = generation.split(stop)[0]
        return generation

    def filtered(self, generation: str) -> str:
        responses = [[generation]]
        for step in self.filters:
            responses = list(step.apply(responses, [None]))
        return responses[0]

    def score(self, generation: str, references: list[str], stop: bool = True, options: dict | None = None) -> float:
        answer = self.filtered(self.stopped(generation) if stop else generation.split("\n")[0])
        result = self.metric(predictions=[answer] * len(references), references=references, **(options or self.options))
        return float(result["exact_match"] > 0)


def _collapsed(text: str) -> str:
    return " ".join(text.split())


def ours(prediction: str, references: list[str]) -> float:
    return METRICS["em"].per_example(extract(["first_line"], prediction), references)


def reason(stock: StockExactMatch, prediction: str, references: list[str], target: float) -> str:
    """The one difference whose undoing makes lm_eval's score `target` (ours)."""
    if stock.score(prediction, references, stop=False) == target:
        return "stop"
    if stock.score(_collapsed(prediction), [_collapsed(r) for r in references], stop=False) == target:
        return "whitespace"
    options = {**stock.options, "regexes_to_ignore": [_WHOLE_ARTICLES.pattern]}
    dropped = [_collapsed(_WHOLE_ARTICLES.sub(" ", r)) for r in references]
    answer = _collapsed(_WHOLE_ARTICLES.sub(" ", prediction.split("\n")[0]))
    if stock.score(answer, dropped, stop=False, options=options) == target:
        return "articles"
    return "unexplained"


def compare(task: str, records: list[dict]) -> dict:
    """Both scores of every record, and each disagreement with its reason."""
    stock = StockExactMatch(task)
    disagreements, totals = [], {"ours": 0.0, "lm_eval": 0.0}
    for record in records:
        mine = ours(record["prediction"], record["references"])
        theirs = stock.score(record["prediction"], record["references"])
        totals["ours"] += mine
        totals["lm_eval"] += theirs
        if mine != theirs:
            disagreements.append(
                {
                    "id": record["id"],
                    "prediction": record["prediction"],
                    "lm_eval_answer": stock.filtered(stock.stopped(record["prediction"])),
                    "references": record["references"][:5],
                    "ours": mine,
                    "lm_eval": theirs,
                    "reason": reason(stock, record["prediction"], record["references"], mine),
                }
            )
    n = len(records)
    return {
        "examples": n,
        "em_ours": 100 * totals["ours"] / n if n else 0.0,
        "em_lm_eval": 100 * totals["lm_eval"] / n if n else 0.0,
        "disagreements": disagreements,
        "by_reason": {r: sum(d["reason"] == r for d in disagreements) for r in REASONS},
    }


def committed_runs(results: Path) -> list[tuple[str, Path]]:
    """(task, predictions file) of every committed NQ and TriviaQA run under `results`."""
    return [(task, p) for task in STOCK_TASKS for p in sorted((results / task).glob("**/predictions.jsonl"))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a results folder (<task>/<method>/<pair>/<run>/predictions.jsonl)")
    parser.add_argument("--out", type=Path, help="write the per-run comparison here as JSON")
    args = parser.parse_args(argv)
    report = {}
    for task, path in committed_runs(args.results):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        report[str(path.parent.relative_to(args.results))] = compare(task, records)
    for run, result in report.items():
        print(
            f"{run}: {result['examples']} examples, EM ours {result['em_ours']:.1f}, "
            f"lm_eval {result['em_lm_eval']:.1f}, {len(result['disagreements'])} disagree {result['by_reason']}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
