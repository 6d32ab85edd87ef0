"""The exact backend: every linear layer in row tiles (adafuse/backend/cpu/tiles.py), attention per request in a
merged pass (adafuse/backend/split_pass.py), one pass after another on the calling thread.

A read's bits are then those of its pass alone, whatever else its pass carries, on any device whose probes find
tiles that hold: it serves a device type that has no backend of its own (`exact`, adafuse/backend/__init__.py), and
the CPU's backend (adafuse/backend/cpu/backend.py) adds what pays on a CPU.

Its options (`Execution.options["exact"]`, or the CPU backend's): `threads`, torch's thread count for the passes,
that of the thread that set up the caller (a kernel's bits may depend on it, and a thread started later, as a
server's engine thread, starts with the process's default).
"""

import time

import torch

from adafuse.backend.calls import (
    alone_pass,
    finish,
    kept_while_used,
    prefix_pass,
    prepared_for,
)
from adafuse.backend.cpu.tiles import CpuPass, KernelProbes, tile_linear_layers
from adafuse.backend.forward import ForwardContext
from adafuse.backend.interface import ALONE, MERGED, PREFIX, PROMPT, Backend, Execution, Pass, Prepared, Ran
from adafuse.backend.probe_store import ProbeStore
from adafuse.backend.split_pass import merged_pass
from adafuse.backend.transformers_check import check_model, check_transformers


class ExactBackend(Backend):
    """Row tiles and per-request attention (module docstring); the probes' verdicts in `probes`."""

    def __init__(self, device_type: str, store: ProbeStore | None = None, cores=None):
        self.device_type = device_type
        self.name = f"{device_type}-exact"
        check_transformers()
        self.probes = KernelProbes(store or ProbeStore.for_environment(), cores)
        self._prepared = kept_while_used()

    def prepare(self, model) -> Prepared:
        prepared = self._prepared.get(id(model))
        if prepared is None:
            check_model(model)
            self._install(model)
            prepared = self._prepared[id(model)] = prepared_for(model)
        return prepared

    def _install(self, model) -> None:
        """What this backend changes in the model: its linear layers in row tiles."""
        tile_linear_layers(model, self.probes)

    def settings(self, how: Execution) -> dict:
        """This backend's options of `how` (module docstring)."""
        return how.options.get(self.device_type, {})

    def execute(self, passes: list[Pass], how: Execution) -> list[Ran]:
        threads = self.settings(how).get("threads")
        if threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        context = ForwardContext(own=CpuPass(tiles=how.exact))
        return [self.run(p, context) for p in passes]

    def run(self, p: Pass, context: ForwardContext) -> Ran:
        """One pass in `context`: its reads' results (their log-softmax where asked) and its seconds."""
        start = time.perf_counter()
        with torch.inference_mode():
            if p.kind == PREFIX:
                results = prefix_pass(p, context)
            elif p.kind in (PROMPT, ALONE) or p.kind == MERGED and len(p.reads) == 1:
                # one read: a plain call of the model, whose bits a packed pass gives each of its reads
                (read,) = p.reads
                results = [finish(read, alone_pass(p.model, read, context))]
            elif p.kind == MERGED:
                results = [
                    finish(r, logits) for r, logits in zip(p.reads, merged_pass(p.model, list(p.reads), context))
                ]
            else:
                raise ValueError(f"a pass is {PREFIX!r}, {PROMPT!r}, {ALONE!r} or {MERGED!r}, not {p.kind!r}")
        seconds = time.perf_counter() - start
        return Ran(results, seconds, seconds)

    def describe(self, model: Prepared, exact: bool) -> dict:
        return {
            "backend": self.name,
            "batch_invariant": exact,
            "failing": [] if exact else ["linear (stock kernels asked: batch_exact=false)"],
            "ops": {
                "linear": "row_tiles" if exact else "stock",
                "rms_norm": "per_position",
                "log_softmax": "per_read",
                "attention": "per_request" if model.splits_attention else "alone",
            },
        }
