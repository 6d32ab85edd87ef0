"""Weights & Biases logging: the config, running metrics per example, final metrics, a predictions table.

Offline by default: the run is written under the run directory and `wandb sync <dir>` uploads it later.
"""

import hashlib
import os
from pathlib import Path


class Tracker:
    def __init__(self, cfg, run_dir: Path, config: dict):
        """`cfg`: a WandbConf (its mode checked when the settings were built)."""
        self.run = None
        self._sums: dict[str, float] = {}
        self._count = 0
        if cfg.mode == "disabled":
            return
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        run_dir = Path(run_dir).resolve()
        self.run = wandb.init(
            mode=cfg.mode,
            project=cfg.project,
            entity=cfg.entity,
            dir=str(run_dir),
            config=config,
            name="/".join(run_dir.parts[-4:]) + _shard_suffix(config),
            # One W&B run per run directory and shard, so a resumed run continues the same record
            # and two shards writing at once never share one.
            id=hashlib.sha1((str(run_dir) + _shard_suffix(config)).encode()).hexdigest()[:16],
            resume="allow",
            settings=wandb.Settings(console="off"),
        )

    def resume(self, scores: list[dict[str, float]]) -> None:
        """Count the examples a previous process finished, so the running means cover them too."""
        for example in scores:
            self._add(example)

    def _add(self, scores: dict[str, float]) -> None:
        self._count += 1
        for name, value in scores.items():
            self._sums[name] = self._sums.get(name, 0.0) + value

    def log_example(self, done: int, scores: dict[str, float], stats) -> None:
        """`scores` on the corpus scale (0-100), so running means read like the final metrics."""
        if self.run is None:
            return
        self._add(scores)
        row = {f"running/{k}": v / self._count for k, v in self._sums.items()}
        row.update({"examples": done, "example/seconds": stats.seconds, "example/rounds": stats.rounds})
        self.run.log(row)

    def finish(self, metrics: dict | None, records: list[dict]) -> None:
        """Close the run; with `metrics` (the run is complete), record them and the predictions table."""
        if self.run is None:
            return
        import wandb

        if metrics is not None:
            self._record_final(metrics, records)
        self.run.finish()
        # finish() can return before W&B's writer, a process of its own, has written the run's log out (it
        # was found holding only its header); tearing the service down waits for it, so the offline run is
        # whole on disk when this returns, for a `wandb sync` or a job's end right after.
        wandb.teardown()

    def _record_final(self, metrics: dict, records: list[dict]) -> None:
        import wandb

        self.run.summary.update({f"final/{k}": v for k, v in metrics["metrics"].items()})
        throughput = metrics["throughput"]
        self.run.summary.update({"n": metrics["n"], "seconds_per_example": throughput["seconds_per_example"]})
        columns = ["id", "prediction", "answer", "references", *sorted({k for r in records for k in r["scores"]})]
        table = wandb.Table(columns=columns)
        for r in records:
            table.add_data(
                r["id"],
                r["prediction"],
                r["answer"],
                " | ".join(r["references"]),
                *(r["scores"].get(k) for k in columns[4:]),
            )
        self.run.log({"predictions": table})


def _shard_suffix(config: dict) -> str:
    task = config["task"]
    return "" if task.get("num_shards", 1) == 1 else f"/shard-{task['shard']}-of-{task['num_shards']}"
