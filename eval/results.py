"""A run directory: config.yaml (written first), predictions.jsonl (one flushed line per example),
metrics.json (atomic). A run killed at any point resumes from it: finished examples are kept,
a torn last line is dropped, and no example is written twice.

Several processes may write one run directory (the shards of a task, a requeued job whose old copy
is still alive): each line is appended under a lock on the file, after reading what the others
appended, so lines never interleave and an example already written is not written again; and a
shard has one writer at a time (`claim`), a second one is refused with ShardBusyError.
"""

import fcntl
import json
import logging
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import yaml

from adafuse.errors import ConfigError, ShardBusyError
from conf.schema import resumable_settings

log = logging.getLogger(__name__)


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
        self.records: dict[str, dict] = {}  # finished examples by id, every writer's
        self._read_bytes = 0  # how much of predictions.jsonl `records` holds
        self.refresh()

    def _check_same_run(self, config: dict) -> None:
        previous = self.path / "config.yaml"
        if not previous.is_file() or not self.predictions_path.is_file():
            return
        old, new = _flat(yaml.safe_load(previous.read_text())), _flat(config)
        changed = sorted(
            k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in resumable_settings(config)
        )
        if changed:
            raise ConfigError(
                f"{self.path} holds a run with other settings ({', '.join(changed)}); "
                "resuming would mix predictions. Choose another hydra.run.dir or delete the directory."
            )

    def refresh(self) -> None:
        """Read the lines appended since the last read, by this process or any other."""
        if not self.predictions_path.is_file():
            return
        with open(self.predictions_path, "rb") as f:
            f.seek(self._read_bytes)
            for line in f:
                if not line.endswith(b"\n"):  # being written, or torn by a kill: not finished
                    break
                self._read_bytes += len(line)
                record = _parse(line, self.predictions_path)
                if record is not None:
                    self.records.setdefault(record["id"], record)

    def append(self, record: dict) -> None:
        """Write one example's line and make it durable before the next example starts; an example
        that another writer finished meanwhile is not written again."""
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        with open(self.predictions_path, "a+b") as f:  # appends land at the end whatever the position
            fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes
            _cut_torn_tail(f)
            self.refresh()
            if record["id"] in self.records:
                log.warning("%s: example %s was already written by another process", self.path, record["id"])
                return
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.refresh()

    @contextmanager
    def claim(self, shard: int, num_shards: int):
        """Be the only writer of this shard while the block runs; a second one gets ShardBusyError."""
        lock = open(self.path / f".shard-{shard}-of-{num_shards}.lock", "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise ShardBusyError(
                f"{self.path}: shard {shard} of {num_shards} is being decoded by {holder}; "
                "wait for it to finish or stop it (two writers would decode the same examples twice)"
            ) from None
        try:
            lock.truncate(0)
            lock.write(f"pid {os.getpid()} on {os.uname().nodename}")
            lock.flush()
            self.refresh()
            yield
        finally:
            lock.close()

    def write_metrics(self, metrics: dict) -> None:
        _atomic_write(self.path / "metrics.json", json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")


def read_predictions(path: Path) -> dict[str, dict]:
    """The finished records of a predictions.jsonl by id (the first line of each id wins)."""
    records = {}
    with open(path, "rb") as f:
        for line in f:
            record = _parse(line, path) if line.endswith(b"\n") else None
            if record is not None:
                records.setdefault(record["id"], record)
    return records


def _parse(line: bytes, path: Path) -> dict | None:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        log.warning("%s: skipping a line that is not JSON (a write cut short): %.60r", path, line)
        return None


def _cut_torn_tail(f) -> None:
    """Under the append lock, an unfinished last line is a writer killed mid-write: remove it."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return
    f.seek(0)
    keep = f.read().rfind(b"\n") + 1
    f.truncate(keep)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: shards write at once
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
