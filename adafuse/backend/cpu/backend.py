"""The CPU's backend: the exact backend's row tiles and per-request attention (adafuse/backend/cpu/exact.py), and
what pays on a CPU.

- The vocabulary projection multiplies in blocks that stay in the processor's cache
  (adafuse/backend/cpu/projection.py).
- Different models' passes of one step run side by side: the first model's on the calling thread, every
  other's on a kept thread of its own, each on its share of the cores (adafuse/backend/cpu/cores.py: MKL's
  per-thread thread count, looked up in libtorch). One model's Python overlaps the other's multiplies. No pass
  reads what another model's pass writes, and a pass's bits never depend on which thread ran it.

Its options (`Execution.options["cpu"]`): `side_by_side` (default True) and `threads` (adafuse/backend/cpu/exact.py).
"""

import torch

from adafuse.backend.cpu.cores import Cores, CoreShare
from adafuse.backend.cpu.exact import ExactBackend
from adafuse.backend.cpu.projection import block_output_projection
from adafuse.backend.cpu.tiles import CpuPass, tile_linear_layers
from adafuse.backend.forward import ForwardContext
from adafuse.backend.interface import Execution, Pass, Ran
from adafuse.backend.probe_store import ProbeStore


class CpuBackend(ExactBackend):
    def __init__(self, device_type: str = "cpu", store: ProbeStore | None = None):
        super().__init__(device_type, store, Cores.of_this_torch())
        self.cores = self.probes.cores

    def _install(self, model) -> None:
        block_output_projection(model, self.probes)
        tile_linear_layers(model, self.probes)

    def execute(self, passes: list[Pass], how: Execution) -> list[Ran]:
        """Each model's passes in order; with the option `side_by_side` (the default) and more than one model in the
        step (and more than one core), every model's at once, each on its share of the cores. The first error, in
        model order, is raised once every model's passes have ended."""
        groups: dict[int, list[int]] = {}  # per model, in order of its first pass: its passes' indices
        for i, p in enumerate(passes):
            groups.setdefault(id(p.model), []).append(i)
        settings = self.settings(how)
        threads = settings.get("threads") or torch.get_num_threads()
        if not (settings.get("side_by_side", True) and len(groups) > 1 and threads > 1):
            return super().execute(passes, how)  # one pass after another, on this thread
        ran: list[Ran | None] = [None] * len(passes)
        share = CoreShare(len(groups))
        inference = torch.is_inference_mode_enabled()

        def run_group(indices: list[int]) -> None:
            # A kept thread holds the thread count it started with, and a kernel's bits may depend on it
            # (attention); inference mode is per thread: each runs in the caller's.
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            context = ForwardContext(own=CpuPass(tiles=how.exact, share=share))
            try:
                with torch.inference_mode(inference):
                    for i in indices:
                        ran[i] = self.run(passes[i], context)
            finally:
                share.leave()

        first, *rest = groups.values()
        others = [self.cores.kept_threads("pass", 7).submit(run_group, indices) for indices in rest]
        errors: list[BaseException] = []
        try:
            run_group(first)
        except BaseException as err:
            errors.append(err)
        for done in others:
            try:
                done.result()
            except BaseException as err:
                errors.append(err)
        if errors:
            raise errors[0]
        return ran
