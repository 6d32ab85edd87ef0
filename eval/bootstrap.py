"""Bootstrap over examples: the standard error of a run's metric, and paired intervals between runs.

Resamples are drawn from a list of example ids, seeded by the ids themselves: two runs resampled on
the same ids get the same resamples, which is what pairs them. A metric that averages per-example
scores (EM, F1, accuracy) is resampled from the scores stored with each prediction; a corpus metric
(BLEU, chrF) from its examples' sufficient statistics (eval/metrics.py `Metric.statistics`): a resample's
score is that of its examples' summed n-gram counts, the number its corpus score gives; a corpus metric
without them is recomputed from the text of every resample.
"""

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eval import paper_metrics  # noqa: F401  (registers the paper_* replicas in METRICS)
from eval.collect import Run
from eval.metrics import METRICS

RESAMPLES = 1000


def resamples(ids: Sequence[str], count: int = RESAMPLES) -> np.ndarray:
    """(count, len(ids)) positions into `ids`, drawn with replacement; the same ids give the same draws."""
    rng = np.random.default_rng(zlib.crc32("\n".join(ids).encode()))
    return rng.integers(0, len(ids), size=(count, len(ids)))


def scores(run: Run, name: str, ids: Sequence[str], draws: np.ndarray) -> np.ndarray:
    """The run's metric `name` on each row of `draws` (positions into `ids`): (len(draws),)."""
    position = {example_id: k for k, example_id in enumerate(run.ids)}
    rows = np.asarray([position[i] for i in ids])[draws]  # positions into run.records
    metric = METRICS[run.config["task"]["metrics"][name]]
    if getattr(metric.corpus, "averages", None) is not None:
        per_example = np.array([r["scores"][name] for r in run.records], dtype=float)
        return 100 * per_example[rows].mean(axis=1)
    texts = [r["prediction"] if metric.raw else r["answer"] for r in run.records]
    references = [r["references"] for r in run.records]
    if metric.statistics is not None:
        per_example, score_of = metric.statistics(texts, references)
        drawn = np.stack([np.bincount(row, minlength=len(texts)) for row in rows])  # times each example is drawn
        return np.array([score_of(summed.tolist()) for summed in drawn @ per_example])  # integers: exact
    return np.array([metric.corpus([texts[i] for i in row], [references[i] for i in row]) for row in rows])


def replicates(run: Run, name: str, ids: Sequence[str], count: int = RESAMPLES) -> np.ndarray:
    """The run's metric on `count` resamples of `ids` (memoised: a table asks for a run's several times)."""
    key = (str(run.path), name, tuple(ids), count)
    if key not in _REPLICATES:
        _REPLICATES[key] = scores(run, name, ids, resamples(ids, count))
    return _REPLICATES[key]


_REPLICATES: dict[tuple, np.ndarray] = {}


def value_on(run: Run, name: str, ids: Sequence[str]) -> float:
    """The run's metric `name` on the examples `ids` alone."""
    return float(scores(run, name, ids, np.arange(len(ids))[None, :])[0])


def standard_error(run: Run, name: str, count: int = RESAMPLES, ids: Sequence[str] | None = None) -> float:
    """Bootstrap standard error of the run's metric over `ids` (default: its own examples)."""
    return float(np.std(replicates(run, name, run.ids if ids is None else ids, count), ddof=1))


def shared_ids(a: Run, b: Run) -> list[str]:
    """The examples both runs scored, in a's order."""
    theirs = set(b.ids)
    return [i for i in a.ids if i in theirs]


@dataclass
class Gain:
    """a over b on the examples both scored, averaged over tasks; intervals are 95% paired bootstrap."""

    n: int  # examples both scored, over all tasks
    a: float
    b: float
    points: float  # a - b
    points_ci: tuple[float, float]
    relative: float | None  # 100 * (a - b) / b, as the paper's gain row; None where b is 0
    relative_ci: tuple[float, float] | None  # None also where b is 0 in some resample


def paired_gain(comparisons: Sequence[tuple[Run, Run, str]], count: int = RESAMPLES) -> Gain | None:
    """Gain of each a over its b (same task, metric `name`), averaged over the comparisons (the tasks
    of a table's average column); None if some pair shares no example."""
    a_point, b_point, a_draws, b_draws, n = [], [], [], [], 0
    for a, b, name in comparisons:
        ids = shared_ids(a, b)
        if not ids:
            return None
        a_point.append(value_on(a, name, ids))
        b_point.append(value_on(b, name, ids))
        a_draws.append(replicates(a, name, ids, count))
        b_draws.append(replicates(b, name, ids, count))
        n += len(ids)
    a_value, b_value = float(np.mean(a_point)), float(np.mean(b_point))
    a_rep, b_rep = np.mean(a_draws, axis=0), np.mean(b_draws, axis=0)
    relative = 100 * (a_value - b_value) / b_value if b_value != 0 else None
    # A resample where b scores 0 has no relative gain: no interval then (a few correct answers out of 50).
    relative_ci = _interval(100 * (a_rep - b_rep) / b_rep) if relative is not None and np.all(b_rep != 0) else None
    return Gain(n, a_value, b_value, a_value - b_value, _interval(a_rep - b_rep), relative, relative_ci)


def _interval(draws: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)
