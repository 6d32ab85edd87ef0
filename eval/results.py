"""A run directory: config.yaml (written before any prediction), predictions.jsonl (one flushed line per
example), batching.jsonl (one line per decoding process: how its forward passes met), metrics.json
(atomic). A run killed at any point resumes from it: finished examples are kept, a torn last line is
dropped, and no example is written twice.

Several processes may write one run directory (the shards of a task, a requeued job whose old copy
is still alive): each line is appended under the run's write lock (.write.lock), after reading what
the others appended, so lines never interleave and an example already written is not written again;
and a shard has one writer at a time (`claim`), a second one is refused with ShardBusyError.

One run, one input and one way of computing: config.yaml records the settings, `source` (what the run
reads: the data's files with their sha256 or its hub splits with their commits, each model's commit or
checksum) and `runtime` (torch's version, each model's resolved device, dtype and GPU), and a process whose
settings, source or runtime differ from the recorded ones may not add predictions (ResumeMismatchError).
A process writes nothing until it is admitted (`admit`, after its shard's claim and its checks): a process
refused before then leaves the directory as it found it, whoever holds it. config.yaml is replaced, and a
line appended, only under the write lock, and an append first checks that config.yaml is still the one its
process was admitted under: shards that start at once on different machines never mix, whichever writes
first.
"""

import fcntl
import json
import logging
import os
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import yaml

from adafuse.errors import ResultsDirError, ResumeMismatchError, ShardBusyError
from conf.schema import batch_invariant, resumable_settings

log = logging.getLogger(__name__)

# a model's pass counts and its passes' seconds (adafuse/engine/executor.py PassCounts), summed over the processes
# that decoded; its KV figures, the most any process reached
PASS_COUNTS = ("passes", "merged_passes", "rows", "merged_prompts", "prefix_passes", "seconds", "host_seconds")
# how a model's passes ran, as its backend describes them (adafuse/backend/interface.py `describe`)
PASS_WAYS = ("backend", "attention", "linear", "rms_norm", "log_softmax")
KV_FIGURES = ("kv_peak_bytes", "kv_peak_bytes_per_example", "kv_prefix_bytes", "longest_context")


def _flat(tree, prefix="") -> dict:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


class RunDir:
    def __init__(self, path: Path, config: dict):
        """`config`: the run's settings, plus `runtime` where this process decodes (see the module docstring).
        Reads what the directory holds and writes nothing in it: `admit` does, once the process may write."""
        self.path = writable_dir(Path(path))
        self.predictions_path = self.path / "predictions.jsonl"
        self.config_path = self.path / "config.yaml"
        self.config = config
        self.records: dict[str, dict] = {}  # finished examples by id, every writer's
        self._read_bytes = 0  # how much of predictions.jsonl `records` holds
        self._admitted_under = None
        self.refresh()

    def check(self) -> None:
        """ResumeMismatchError if the directory holds predictions made with other settings or another runtime."""
        written = self.predictions_path.is_file() and self.predictions_path.stat().st_size > 0
        if written and self.config_path.is_file():
            self._check_same_run(yaml.safe_load(self.config_path.read_text()))

    def admit(self) -> "RunDir":
        """Check again, under the write lock, and record this process's settings in config.yaml: from now on
        it may write (`append`)."""
        with self._locked():
            self.check()
            _atomic_write(self.config_path, yaml.safe_dump(self.config, sort_keys=False, allow_unicode=True))
            self._admitted_under = _stamp(self.config_path)
        return self

    @contextmanager
    def _locked(self):
        """Hold the run's write lock: config.yaml is replaced, and predictions appended, only under it."""
        with open(self.path / ".write.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def _check_same_run(self, recorded: dict) -> None:
        """Refuse to add to predictions made with other settings, from other data or models, or on another
        runtime (ResumeMismatchError)."""
        recorded = dict(recorded or {})
        resumable = resumable_settings(self.config) & resumable_settings(recorded)
        old_runtime, new_runtime = recorded.pop("runtime", None), self.config.get("runtime")
        old_source, new_source = recorded.pop("source", None), self.config.get("source")
        old = _flat(recorded)
        new = _flat({k: v for k, v in self.config.items() if k not in ("runtime", "source")})
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in resumable)
        if changed == ["batch_size"] and old_runtime and not batch_invariant({"runtime": old_runtime}):
            raise ResumeMismatchError(
                f"{self.path} holds a run whose passes were batch-dependent ({describe_dependence(old_runtime)}): "
                f"its outputs depend on its batch size, {old.get('batch_size')}, and this process asks for "
                f"{new.get('batch_size')}. Resume it with batch_size={old.get('batch_size')}, or write this one to "
                "another directory (results_dir=... or hydra.run.dir=...)."
            )
        if changed:
            raise ResumeMismatchError(
                f"{self.path} holds a run with other settings ({', '.join(changed)}); "
                "resuming would mix predictions. Choose another hydra.run.dir or delete the directory."
            )
        if old_source is None or new_source is None:
            if new_source is not None:
                log.warning("%s: its predictions do not record the data and models they were made from", self.path)
        elif differences := source_differences(old_source, new_source):
            raise ResumeMismatchError(
                f"{self.path} holds predictions made from other inputs: {'; '.join(differences)}. Their prompts or "
                "models are not this process's, so one run must not mix them: write this one to another directory "
                "(results_dir=... or hydra.run.dir=...), or resume it with the data and models it recorded "
                "(config.yaml, source; docs/sweeps.md, 'One run, one source')."
            )
        if old_runtime is None or new_runtime is None:
            if new_runtime is not None:
                log.warning("%s: its predictions do not record the device and dtype they were decoded on", self.path)
            return
        differences = runtime_differences(old_runtime, new_runtime)
        if differences:
            raise ResumeMismatchError(
                f"{self.path} holds predictions decoded on {describe_runtime(old_runtime)}; this process would "
                f"decode on {describe_runtime(new_runtime)} ({'; '.join(differences)}). Outputs can differ in "
                "their last bits between the two, so one run must not mix them: resume it on its recorded "
                "device and dtype (each model's `device` and `dtype` settings, the same torch), or write this "
                "one to another directory (results_dir=... or hydra.run.dir=...)."
            )

    def _check_still_admitted(self) -> None:
        """Under the append lock: if another process replaced config.yaml since this one was admitted (a
        shard that started at the same time), check against it as a resume would."""
        stamp = _stamp(self.config_path)
        if stamp is not None and stamp != self._admitted_under:
            self._check_same_run(yaml.safe_load(self.config_path.read_text()))
            self._admitted_under = stamp

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
        if self._admitted_under is None:
            raise RuntimeError(f"{self.path}: a process writes predictions only once admitted (RunDir.admit)")
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        with self._locked(), open(self.predictions_path, "a+b") as f:  # appends land at the end whatever the position
            self._check_still_admitted()
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
        """Be the only writer of this shard while the block runs; a second one gets ShardBusyError. The claim's lock
        file goes when the block ends, removed while still held, so that a run refused after its claim leaves no
        file behind; a process that opened the file just before then finds, once it holds it, that the name now
        belongs to no file or another one, and claims the file under the name."""
        path = self.path / f".shard-{shard}-of-{num_shards}.lock"
        while True:
            lock = open(path, "a+")
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
            if _names(path, lock):
                break
            lock.close()  # its holder removed it as we opened it: the claim is the file under the name now
        try:
            lock.truncate(0)
            lock.write(f"pid {os.getpid()} on {os.uname().nodename}")
            lock.flush()
            self.refresh()
            yield
        finally:
            path.unlink(missing_ok=True)
            lock.close()

    def append_batching(self, shard: int, examples: int, models: dict[str, dict]) -> None:
        """Record how one process's forward passes met (`DecodeStream.batching`) after it decoded `examples`."""
        line = json.dumps({"shard": shard, "examples": examples, "models": models}) + "\n"
        with open(self.path / "batching.jsonl", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(line)

    def batching(self) -> dict[str, dict]:
        """Per model name: how every process's requests met, their pass counts summed and the most KV any held,
        from batching.jsonl (a count a process did not report, from before it was counted, adds nothing). A mode
        that differed between processes reads "mixed"."""
        path = self.path / "batching.jsonl"
        entries = [_parse(line, path) for line in path.read_bytes().splitlines()] if path.is_file() else []
        totals: dict[str, dict] = {}
        for entry in filter(None, entries):
            for name, report in entry["models"].items():
                total = totals.setdefault(name, {**report, **dict.fromkeys(PASS_COUNTS, 0)})
                for key in PASS_WAYS:  # a report from before a way was recorded says nothing of it
                    if key in report:
                        total[key] = report[key] if total.get(key, report[key]) == report[key] else "mixed"
                for key in PASS_COUNTS:
                    total[key] += report.get(key, 0)
                for key in KV_FIGURES:
                    if key in report:
                        total[key] = max(total.get(key, 0), report[key])
        return totals

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


def writable_dir(path: Path) -> Path:
    """Create `path` if needed and check that files can be written in it; ResultsDirError if not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker else f"{err.strerror}: {err.filename or path}"
        raise ResultsDirError(
            f"cannot create or write the run directory {path} ({why}); "
            "point results_dir (or hydra.run.dir) at a folder this process can write"
        ) from None
    return path


def runtime_differences(recorded: dict, now: dict) -> list[str]:
    """What differs between two `runtime` records, one phrase each."""
    differences = []
    if recorded.get("torch") != now.get("torch"):
        differences.append(f"torch {recorded.get('torch')} then, {now.get('torch')} now")
    old, new = recorded.get("models", []), now.get("models", [])
    if [m.get("name") for m in old] != [m.get("name") for m in new]:
        differences.append(f"models {[m.get('name') for m in old]} then, {[m.get('name') for m in new]} now")
    for then, current in zip(old, new):
        # A model's vocabulary decides its utf8_rule (eval/runner.py), the same on any device, and its backend
        # how its passes run on its device (`passes`): both are known only once the model has loaded, after the
        # first check.
        for key in sorted((then.keys() | current.keys()) - {"name", "utf8_rule", "passes"}):
            if then.get(key) != current.get(key):
                differences.append(f"{current.get('name')} {key} {then.get(key)} then, {current.get(key)} now")
    return differences


def describe_dependence(runtime: dict) -> str:
    """Which models' passes were batch-dependent, where, and which op types failed to be invariant."""
    found = []
    for m in runtime.get("models", []):
        passes = m.get("passes") or {}
        if not passes.get("batch_invariant", True):
            where = m.get("gpu") or m.get("device")
            found.append(f"{m.get('name')} on {where}: {', '.join(passes.get('failing') or ['?'])}")
    return "; ".join(found)


def source_differences(recorded: dict, now: dict) -> list[str]:
    """What differs between two `source` records, one phrase each. The data folder's own path is not compared:
    the same files elsewhere (another checkout, a cluster's scratch disk) are the same data."""
    differences = []
    old, new = recorded.get("data") or {}, now.get("data") or {}
    kinds = ("the hub" if old.get("hub") else "local files", "the hub" if new.get("hub") else "local files")
    if kinds[0] != kinds[1]:
        differences.append(f"data from {kinds[0]} then, from {kinds[1]} now")
    old_files, new_files = old.get("files") or {}, new.get("files") or {}
    for name in sorted(old_files.keys() | new_files.keys()):
        if old_files.get(name) != new_files.get(name):
            then, current = (_short(files.get(name)) for files in (old_files, new_files))
            differences.append(f"data file {name}: sha256 {then} then, {current} now")
    splits = {(h["dataset"], h["config"], h["split"]): h["commit"] for h in old.get("hub") or []}
    for h in new.get("hub") or []:
        key = (h["dataset"], h["config"], h["split"])
        if key in splits and splits[key] != h["commit"]:
            differences.append(
                f"{h['dataset']} split {h['split']} at commit {_short(splits[key])} then, {_short(h['commit'])} now"
            )
    old_models, new_models = recorded.get("models") or [], now.get("models") or []
    for then, current in zip(old_models, new_models):
        for key in ("commit", "sha256"):
            if then.get(key) != current.get(key):
                differences.append(
                    f"model {current.get('name')} {key} {_short(then.get(key))} then, {_short(current.get(key))} now"
                )
    return differences


def _short(value: str | None) -> str:
    return "none" if value is None else value[:12]


def describe_runtime(runtime: dict) -> str:
    models = ", ".join(
        f"{m.get('name')} {m.get('dtype')} on {m.get('device')}" + (f" ({m['gpu']})" if m.get("gpu") else "")
        for m in runtime.get("models", [])
    )
    return f"{models or 'no models'} with torch {runtime.get('torch')}"


def _names(path: Path, file) -> bool:
    """Is `file` (open) the file that `path` names now?"""
    try:
        return os.stat(path).st_ino == os.fstat(file.fileno()).st_ino
    except FileNotFoundError:
        return False


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """Which version of a file this is: an atomic replace gives it a new inode."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


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
