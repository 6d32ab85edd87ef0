"""Runs for the tests, in the runner's own format: a task decoded through eval.runner with short
budgets, what a run wrote read back, and a finished run directory written by hand (predictions scored by
the task, metrics.json from eval.runner.summary) for the table and figure scripts."""

import json
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf

from adafuse.trace import Stats
from conf.compose import compose_run
from eval.results import RunDir
from eval.runner import decoding_models, main, model_sources, settings_of, summary
from eval.tasks import Task
from tests.support.paths import SHARED_DATA

# Short budgets keep CI fast; QA answers fit, GSM8K chains and translations are cut (scored as they are).
BUDGET = {"gsm8k": 8, "flores_en_de": 8, "flores_de_en": 8}


def run_task(task: str, method: str, out: Path, *extra: str) -> dict | None:
    overrides = [
        f"task={task}",
        f"method={method}",
        "task.limit=5",
        f"data.dir={SHARED_DATA}",
        "wandb.mode=disabled",
        "progress=false",
    ]
    if task in BUDGET:
        overrides.append(f"task.max_new_tokens={BUDGET[task]}")
    return main(compose_run(*overrides, *extra), out)


def read_predictions(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def decoded(record: dict) -> dict:
    """A record without its timing, nor tokens_fed: how much of the prompt a model reads depends on what
    it read last (a shared prefix is read once), so on which examples this process decoded before."""
    varies = ("seconds", "run_seconds", "tokens_fed")
    return {**record, "stats": {k: v for k, v in record["stats"].items() if k not in varies}}


def write_run(root: Path, task: str, method: str, correct: list[bool], *overrides: str) -> Path:
    """A finished run of `task` whose example k is answered right iff correct[k], as the runner writes it."""
    cfg = compose_run(
        f"task={task}", f"method={method}", f"task.limit={len(correct)}", f"data.dir={SHARED_DATA}", *overrides
    )
    settings = settings_of(cfg)
    task_ = Task(settings.task, settings.data)
    run_id = ",".join(overrides) or "default"
    source = {"data": task_.sources.record(), "models": model_sources(decoding_models(settings))}
    config = {**OmegaConf.to_container(cfg, resolve=True), "source": source}
    out = RunDir(root / task / method / "tiny" / run_id, config).admit()
    for example, right in zip(task_.examples, correct, strict=True):
        prediction = example.references[0] if right else "no idea"
        answer, scores = task_.score(example, prediction)
        stats = Stats("stop", 2, [1, 2], [3, 3], [4, 4], [2, 2], 0.5)
        out.append(
            {"id": example.id, "prompt": "", "prediction": prediction, "answer": answer}
            | {"references": example.references, "scores": scores, "stats": asdict(stats)}
        )
    records = [out.records[ex.id] for ex in task_.examples]
    out.write_metrics(summary(task_, records, settings, decoding_models(settings), out))
    return out.path


def pattern(n: int, every: int) -> list[bool]:
    return [k % every == 0 for k in range(n)]
