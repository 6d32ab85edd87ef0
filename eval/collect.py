"""The finished runs below a results directory, as tables and figures read them: each run's
metrics.json, with the config.yaml and predictions.jsonl beside it (the results layout)."""

import json
import logging
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

from adafuse.errors import DataError
from eval.results import read_predictions

log = logging.getLogger(__name__)

# Where one override of a run id ends: at a comma followed by the next one's key and "=" (a value such as
# method.weights=[0.5,0.5] holds commas of its own). Keys as a run id spells them (conf/schema.py `run_id`).
_NEXT_OVERRIDE = re.compile(r",(?=[+~]*[A-Za-z_][\w.@%-]*=)")

# Knobs that tables and figures name even at their default: without them a row or a bar does not say which
# variant ran (LLM-Blender's ranker, nll or PairRM; DeePEn's main member, an index or the SentencePiece one).
NAMED_KNOBS = {"llm_blender": "ranker", "deepen": "main"}


@dataclass
class Run:
    path: Path  # results/<task>/<method>/<model_pair>/<run_id>
    metrics: dict  # metrics.json
    config: dict = field(repr=False)  # config.yaml

    @property
    def task(self) -> str:
        return self.metrics["task"]

    @property
    def method(self) -> str:
        return self.metrics["method"]["name"]

    @property
    def run_id(self) -> str:
        """The overrides that can change a prediction, as in the directory name ('default': none)."""
        return self.path.name

    @property
    def overrides(self) -> list[str]:
        return [] if self.run_id == "default" else _NEXT_OVERRIDE.split(self.run_id)

    @property
    def ids(self) -> list[str]:
        return self.metrics["ids"]

    @cached_property
    def records(self) -> list[dict]:
        """The scored examples' records, in the order of `ids`."""
        by_id = read_predictions(self.path / "predictions.jsonl")
        missing = [i for i in self.ids if i not in by_id]
        if missing:
            raise DataError(
                f"{self.path}: metrics.json scores {len(missing)} examples with no prediction ({missing[:3]})"
            )
        return [by_id[i] for i in self.ids]

    @property
    def protocol(self) -> str:
        """The run's protocol (conf/protocol/): none, or paper; runs from before the switch: none."""
        return self.metrics.get("protocol") or self.config.get("protocol") or "none"

    def metric_name(self, kind: str) -> str | None:
        """The reported name of the task's primary metric: the first one, or the first paper_* replica;
        a protocol=paper run reports its paper_* replica in every table (the paper's scorers are part of it)."""
        names = list(self.metrics["metrics"])
        if kind == "paper" or self.protocol == "paper":
            names = [n for n in names if n.startswith("paper_")]
        return names[0] if names else None


def read_metrics(run_dir: Path) -> dict:
    """A run's metrics.json; DataError naming the run if it is not JSON (a copy cut short, a hand edit)."""
    path = Path(run_dir) / "metrics.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(
            f"{path} is not valid JSON ({err}): rerun the run's command, or python scripts/merge.py {run_dir}, "
            "to write it again"
        ) from None


def read_config(run_dir: Path) -> dict:
    """A run's config.yaml; DataError naming the run if it is not YAML."""
    path = Path(run_dir) / "config.yaml"
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise DataError(f"{path} is not valid YAML ({err}); the run's command writes it again") from None


def find_runs(root: Path) -> list[Run]:
    """Every run below `root` that has written its metrics.json, in path order."""
    runs = []
    for path in sorted(Path(root).rglob("metrics.json")):
        metrics = read_metrics(path.parent)
        if "ids" not in metrics:  # written before metrics.json listed its examples
            log.info("%s: skipped, its metrics.json does not list the scored examples (rerun to rewrite it)", path)
            continue
        runs.append(Run(path.parent, metrics, read_config(path.parent)))
    return runs


def runs_of_pair(root: Path, pair: str | None) -> tuple[list[Run], str]:
    """The runs below `root` of one model pair, and its name: `pair`, or the only pair they hold.

    For the command-line scripts: results that hold several pairs, with none chosen, end the script
    with a message that says to choose one with --pair."""
    runs = find_runs(root)
    pairs = sorted({r.metrics["model_pair"] for r in runs})
    if pair is None and len(pairs) > 1:
        raise SystemExit(f"the results hold several model pairs ({', '.join(pairs)}): choose one with --pair")
    pair = pair or (pairs[0] if pairs else "")
    return [r for r in runs if r.metrics["model_pair"] == pair], pair


def shared_settings(runs: list[Run]) -> list[str]:
    """The overrides other than method settings that every run has (e.g. a quick grid's
    task.max_new_tokens=8): a table or figure states them once instead of in every row's name."""
    if not runs:
        return []
    shared = set.intersection(*(set(r.overrides) for r in runs))
    return sorted(o for o in shared if not o.startswith("method."))


def shared_by_task(runs: list[Run]) -> dict[str, list[str]]:
    """Per task, the overrides every run has (`shared_settings`) and the task.* settings every run of the task has
    (a task read from your own file: task.path=FILE): they name a column, never a row of a table or a point of a
    figure."""
    everyone = shared_settings(runs)
    out = {}
    for task in {r.task for r in runs}:
        common = set.intersection(*(set(r.overrides) for r in runs if r.task == task))
        out[task] = everyone + sorted(o for o in common if o.startswith("task.") and o not in everyone)
    return out
