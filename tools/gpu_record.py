"""What the GPU checks (tools/gpu_check.py, tools/gpu_full.py) share: the JSON they write as each step ends, under
one deadline, and the environment they ran in."""

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch


def environment() -> dict:
    """Python, torch, transformers and triton, CUDA, and each visible GPU with its memory."""
    import transformers

    from adafuse.backend.cuda import available

    cuda = torch.cuda.is_available()
    gpus = [
        {"name": torch.cuda.get_device_name(d), "memory_gb": torch.cuda.get_device_properties(d).total_memory / 2**30}
        for d in range(torch.cuda.device_count() if cuda else 0)
    ]
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": _version("triton") if available() else None,
        "cuda": torch.version.cuda,
        "device": gpus[0]["name"] if gpus else "cpu",
        "gpus": gpus,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if cuda else None,
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


class StepRecord:
    """A check's JSON, written again as each step ends, so that a check stopped at any point keeps every
    step that ended. Steps share one deadline: a step with no time left is skipped and says so."""

    def __init__(self, out: Path, seconds: float, record: dict):
        self.out, self.deadline, self.record = out, time.perf_counter() + seconds, record
        out.parent.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def step(self, name: str, run: Callable[[float], dict]) -> dict:
        """Record `run(seconds left)` under `name`, with the seconds it took."""
        started, left = time.perf_counter(), self.left()
        try:
            result = run(left) if left > 0 else {"skipped": "out of time"}
        except Exception as err:  # a step that fails is recorded; the others still run
            result = {"error": f"{type(err).__name__}: {err}"}
        result["seconds"] = time.perf_counter() - started
        self.put(name, result)
        print(f"{name}: {result['seconds']:.0f} s", flush=True)
        return result

    def put(self, name: str, result) -> None:
        self.record[name] = result
        self.out.write_text(json.dumps(self.record, indent=2) + "\n")
