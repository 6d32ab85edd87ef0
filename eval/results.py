"""A run directory: config.yaml (written first), predictions.jsonl (one flushed line per example),
metrics.json (atomic). A run killed at any point resumes from it: finished examples are kept,
a torn last line is dropped, and no example is written twice.
"""

import json
import os
import subprocess
from pathlib import Path

import yaml

from adafuse.errors import ConfigError

# Settings that may change between a run and its resumption without changing any prediction.
RESUMABLE_CHANGES = {
    "task.limit",
    "data.dir",
    "cache_dir",
    "threads",
    "batch_size",
    "progress",
    "wandb.mode",
    "wandb.project",
    "wandb.entity",
}


def _flat(tree, prefix="") -> dict:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


class RunDir:
    def __init__(self, path: Path, config: dict):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.predictions_path = self.path / "predictions.jsonl"
        self._check_same_run(config)
        _atomic_write(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
        self.records = self._read_finished()

    def _check_same_run(self, config: dict) -> None:
        previous = self.path / "config.yaml"
        if not previous.is_file() or not self.predictions_path.is_file():
            return
        old, new = _flat(yaml.safe_load(previous.read_text())), _flat(config)
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in RESUMABLE_CHANGES)
        if changed:
            raise ConfigError(
                f"{self.path} holds a run with other settings ({', '.join(changed)}); "
                "resuming would mix predictions. Choose another hydra.run.dir or delete the directory."
            )

    def _read_finished(self) -> dict[str, dict]:
        """Finished records by id. A torn last line (killed mid-write) is cut off the file."""
        if not self.predictions_path.is_file():
            return {}
        records, good_bytes = {}, 0
        with open(self.predictions_path, "rb") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    break
                if not line.endswith(b"\n"):
                    break
                records.setdefault(record["id"], record)
                good_bytes += len(line)
        if good_bytes != self.predictions_path.stat().st_size:
            with open(self.predictions_path, "r+b") as f:
                f.truncate(good_bytes)
        return records

    def append(self, record: dict) -> None:
        """Write one example's line and make it durable before the next example starts."""
        with open(self.predictions_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records[record["id"]] = record

    def write_metrics(self, metrics: dict) -> None:
        _atomic_write(self.path / "metrics.json", json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
