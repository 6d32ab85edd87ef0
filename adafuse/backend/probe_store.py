"""Kernel probe verdicts kept on disk, so that a process does not probe again what a process in the same
environment has already probed (adafuse/backend/cpu/tiles.py: row tiles, one-call and fewer-thread probes).

A verdict is a fact about the kernel libraries and the processor, not about any model's weights: whether a
multiply of this shape, dtype, layout, row count and thread count sums in the same order as another. So it
holds for every process whose torch build, processors and kernel settings are those of the process that
probed it. That environment is the store's name: `<cache>/kernel_probes/<fingerprint>.jsonl` (the cache is
$ADAFUSE_CACHE, else ~/.cache/adafuse; `ADAFUSE_PROBE_STORE=off` turns the store off, a folder path moves
it). A different torch, MKL or oneDNN build, processor, GPU, matmul precision setting or kernel environment
variable is another file, probed afresh. Each verdict is one appended line, so the SLURM jobs of a sweep can
share one store; a line that cannot be read is skipped, and a key recorded with two different verdicts is
not trusted: it is probed again. A store that cannot be written leaves every verdict to this process.
"""

import hashlib
import json
import logging
import os
import platform
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from adafuse.config import default_cache_dir

log = logging.getLogger(__name__)

FORMAT = 1  # bump when a table's meaning changes: old files are then never read
# Environment variables that pick kernels or their instruction sets (thread counts are in every probe's key)
ENV_PREFIXES = ("MKL_", "DNNL_", "ONEDNN_", "ATEN_CPU_", "CUBLAS", "NVIDIA_TF32", "TORCH_BLAS", "TORCH_CUDNN")


class ProbeStore:
    """The verdicts on disk for this process's environment (`store_path`), read on first use; a verdict this
    process probes is appended. Owned by the backend that probes (adafuse/backend/__init__.py): one per process."""

    def __init__(self, path: Path | None):
        self.path = path  # None: the store is off
        self._verdicts: dict | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_environment(cls) -> "ProbeStore":
        """The store of this process's environment, as `ADAFUSE_PROBE_STORE` sets it (`store_path`)."""
        return cls(store_path())

    @classmethod
    def for_gpu(cls, device, code: str) -> "ProbeStore":
        """The store of one GPU's facts (`gpu_fingerprint`) and of the probed kernels' source (`code`, a hash): what
        the kernels do depends on them alone, not on the host's processor, so every node of a cluster with this GPU
        and software reads the same verdicts, and edited kernels are probed afresh."""
        return cls(store_path(gpu_fingerprint(device) | {"code": code}))

    def verdicts(self) -> dict:
        """{(table, key repr): verdict}, read once; {} when the store is off or holds none."""
        with self._lock:
            if self._verdicts is None:
                self._verdicts = _read(self.path) if self.path is not None and self.path.exists() else {}
            return self._verdicts

    def record(self, table: str, key: tuple, verdict) -> None:
        if self.path is None:
            return
        line = json.dumps({"table": table, "key": repr(key), "verdict": verdict}) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # one write of one short line in append mode: whole lines, whichever processes share the file
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
        except OSError as err:
            log.warning("kernel probe store %s cannot be written (%s): verdicts stay in this process", self.path, err)
            self.path = None


class Verdicts(dict):
    """One table of probe verdicts: the process's own (a plain dict, which tests may set), backed by a store."""

    def __init__(self, table: str, store: ProbeStore):
        super().__init__()
        self.table = table
        self.store = store

    def get_or_probe(self, key: tuple, probe: Callable[[], object]):
        """The verdict for `key`: this process's, else the store's, else `probe()` (recorded in both)."""
        if key in self:
            return self[key]
        stored = self.store.verdicts().get((self.table, repr(key)))
        if stored is not None:
            self[key] = stored
            return stored
        verdict = probe()
        self[key] = verdict
        self.store.record(self.table, key, verdict)
        return verdict


def store_path(facts: dict | None = None) -> Path | None:
    """The store's file for an environment's facts (default: this process's, `fingerprint`), or None when the
    store is off."""
    setting = os.environ.get("ADAFUSE_PROBE_STORE", "")
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    folder = Path(setting).expanduser() if setting else default_cache_dir() / "kernel_probes"
    facts = fingerprint() if facts is None else facts
    return folder / f"{hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]}.jsonl"


def gpu_fingerprint(device) -> dict:
    """What decides how a GPU's kernels sum: the device and its compute capability, the torch build with its CUDA,
    cuBLAS and Triton, and the matmul precision settings and kernel environment variables."""
    facts = {
        "format": FORMAT,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cublas": _package_version("nvidia-cublas-cu12") or _package_version("nvidia-cublas"),
        "triton": _package_version("triton"),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    if torch.device(device).type == "cuda":
        facts["device"] = [torch.cuda.get_device_name(device), list(torch.cuda.get_device_capability(device))]
        facts["reduced_precision"] = [
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        ]
    else:  # the kernels' logic run on the host (Triton's interpreter): the processor decides
        facts["device"] = [str(device), _cpu()]
    return facts


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def fingerprint() -> dict:
    """What decides how a multiply sums, besides its shape: the torch build and its kernel libraries, the
    processors, the GPUs and their matmul settings, and the kernel libraries' environment variables."""
    facts = {
        "format": FORMAT,
        "torch": torch.__version__,
        "build": torch.__config__.show(),
        "machine": platform.machine(),
        "cpu": _cpu(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    if torch.cuda.is_available():
        facts["cuda"] = {
            "version": torch.version.cuda,
            "devices": [
                [torch.cuda.get_device_name(i), list(torch.cuda.get_device_capability(i))]
                for i in range(torch.cuda.device_count())
            ],
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "reduced_precision": [
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
                torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            ],
        }
    return facts


def _cpu() -> str:
    """The processor's model and instruction-set flags (Linux), else what the platform says of it."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    fields = {}
    for line in info.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return f"{fields.get('model name', '')} | {fields.get('flags', fields.get('Features', ''))}"


def _read(path: Path) -> dict:
    verdicts, conflicts, unreadable = {}, set(), 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                entry = json.loads(line)
                name = (entry["table"], entry["key"])
                verdict = entry["verdict"]
            except (ValueError, KeyError, TypeError):
                unreadable += 1
                continue
            if name in verdicts and verdicts[name] != verdict:
                conflicts.add(name)
            verdicts[name] = verdict
    if unreadable:
        log.warning("kernel probe store %s: %d unreadable lines skipped", path, unreadable)
    if conflicts:
        log.warning("kernel probe store %s: %d keys hold two verdicts; they are probed again", path, len(conflicts))
    return {name: verdict for name, verdict in verdicts.items() if name not in conflicts}
