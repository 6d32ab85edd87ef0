"""Weights & Biases logging: the config, running metrics per example, final metrics, a predictions table.

Offline by default: the run is written under the run directory and `wandb sync <dir>` uploads it later.
"""

import hashlib
import os
from pathlib import Path

from adafuse.errors import ConfigError

MODES = ("offline", "online", "disabled")


class Tracker:
    def __init__(self, cfg, run_dir: Path, config: dict):
        if cfg.mode not in MODES:
            raise ConfigError(f"wandb.mode must be one of {MODES}, got {cfg.mode!r}")
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
            name="/".join(run_dir.parts[-4:]),
            # One W&B run per run directory, so a resumed run continues the same record.
            id=hashlib.sha1(str(run_dir).encode()).hexdigest()[:16],
            resume="allow",
            settings=wandb.Settings(console="off"),
        )

    def log_example(self, done: int, scores: dict[str, float], stats) -> None:
        """`scores` on the corpus scale (0-100), so running means read like the final metrics."""
        if self.run is None:
            return
        self._count += 1
        for name, value in scores.items():
            self._sums[name] = self._sums.get(name, 0.0) + value
        row = {f"running/{k}": v / self._count for k, v in self._sums.items()}
        row.update({"examples": done, "example/seconds": stats.seconds, "example/rounds": stats.rounds})
        self.run.log(row)

    def finish(self, metrics: dict, records: list[dict]) -> None:
        if self.run is None:
            return
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
        self.run.finish()
