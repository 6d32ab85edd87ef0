"""The exact backend on any torch device: every linear layer in row tiles (adafuse/backend/tiles.py), attention
per request in a merged pass (adafuse/backend/split_pass.py), one pass after another on the calling thread.

A read's bits are then those of its pass alone, whatever else its pass carries, on any device whose probes
find tiles that hold (docs/speed.md says what is known of GPUs). The CPU's backend (adafuse/backend/cpu/)
adds what pays on a CPU.
"""

import inspect
import time
import weakref
from dataclasses import replace

import torch

from adafuse.backend.attention import split_attention
from adafuse.backend.forward import ForwardContext, forward_context
from adafuse.backend.interface import ALONE, MERGED, PREFIX, Backend, Execution, Pass, Prepared, Ran, Read
from adafuse.backend.live import on_device, packed_logits, padded_rows
from adafuse.backend.probe_store import ProbeStore
from adafuse.backend.split_pass import merged_pass
from adafuse.backend.tiles import KernelProbes, register_probes, tile_linear_layers
from adafuse.backend.transformers_check import check_model, check_transformers

MEMORY_SHARE = 0.8  # of the memory free at a step, what its passes may take


def prepared_for(model) -> Prepared:
    """How a pass calls `model`, once its backend has installed what it changes in it."""
    params = inspect.signature(model.forward).parameters
    body = model.get_decoder()
    return Prepared(
        model=model,
        device=model.device,
        # transformers >= 5.24 names the argument `cache`; 5.23 and remote-code models `past_key_values`
        cache_arg="cache" if "cache" in params else "past_key_values",
        body=body,
        body_cache_arg="cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values",
        keeps_last="logits_to_keep" in params,
        splits_attention=split_attention(model),
    )


def kept_while_used() -> "weakref.WeakValueDictionary[int, Prepared]":
    """A backend's prepared models by id(model), each kept while something uses it (its runner): a backend lives as
    long as the process, and holding them itself would keep every model it ever prepared, so an in-process sweep
    would hold each pair it loaded. A Prepared holds its model, so an id here is never a dead model's."""
    return weakref.WeakValueDictionary()


class ExactBackend(Backend):
    """Row tiles and per-request attention (module docstring); the probes' verdicts in `probes`."""

    def __init__(self, device_type: str, store: ProbeStore | None = None, cores=None):
        self.device_type = device_type
        self.name = f"{device_type}-exact"
        check_transformers()
        self.probes = KernelProbes(store or ProbeStore.for_environment(), cores)
        register_probes(device_type, self.probes)
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
        tile_linear_layers(model)

    def execute(self, passes: list[Pass], how: Execution) -> list[Ran]:
        if how.threads is not None and torch.get_num_threads() != how.threads:
            torch.set_num_threads(how.threads)
        context = ForwardContext(tiles=how.exact)
        return [self.run(p, context) for p in passes]

    def run(self, p: Pass, context: ForwardContext) -> Ran:
        """One pass in `context`: its reads' results (their log-softmax where asked) and its seconds."""
        start = time.perf_counter()
        with torch.inference_mode():
            if p.kind == PREFIX:
                results = prefix_pass(p, context)
            elif p.kind == ALONE:
                (read,) = p.reads
                results = [finish(read, alone_pass(p.model, read, context))]
            elif p.kind == MERGED:
                results = [
                    finish(r, logits) for r, logits in zip(p.reads, merged_pass(p.model, list(p.reads), context))
                ]
            else:
                raise ValueError(f"a pass is {PREFIX!r}, {ALONE!r} or {MERGED!r}, not {p.kind!r}")
        return Ran(results, self.elapsed(start, p.model.device))

    def elapsed(self, start: float, device: torch.device) -> float:
        """Seconds since `start` (perf_counter) of the passes on `device`."""
        return time.perf_counter() - start

    def memory_budget(self, device: torch.device) -> int:
        return int(device_free_memory(device) * MEMORY_SHARE)

    def free_memory(self, device: torch.device) -> int:
        return device_free_memory(device)

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


def device_free_memory(device: torch.device) -> int:
    """Bytes free on `device` now: the GPU's (`mem_get_info`, and what torch's allocator keeps reserved but holds
    nothing in), else the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    import psutil

    return psutil.virtual_memory().available


def prefix_pass(p: Pass, context: ForwardContext) -> list[None]:
    """A PREFIX pass: its one read's ids into its empty cache, through the model's body alone (no logits)."""
    (read,) = p.reads
    with forward_context(context):
        ids = on_device(read.input_ids, p.model.device)
        p.model.body(input_ids=ids, use_cache=True, **{p.model.body_cache_arg: read.cache})
    return [None]


def alone_pass(model: Prepared, read: Read, context: ForwardContext) -> torch.Tensor:
    """One read's float32 logits from a pass of its own. `last_only` makes the vocabulary projection's logits
    for the last position alone (a 1,400-token prompt would otherwise materialise 1.5 GB of logits with a 262k
    vocabulary); `lengths` computes only each row's real ids (adafuse/backend/live.py)."""
    kwargs = {model.cache_arg: read.cache}
    if read.last_only and model.keeps_last:
        kwargs["logits_to_keep"] = 1
    width = read.input_ids.shape[1]
    live = padded_rows(read.lengths, width, model.device)
    with forward_context(replace(context, live=live)):
        logits = model.model(input_ids=on_device(read.input_ids, model.device), use_cache=True, **kwargs).logits
    return logits.float() if read.lengths is None else packed_logits(logits, read.lengths, width).float()


def finish(read: Read, logits: torch.Tensor) -> torch.Tensor:
    """A read's result from its logits: themselves, or their log-softmax with the `masked` ids at -inf (set in
    place: the pass's own logits, which nothing else reads)."""
    if not read.logprobs:
        return logits
    if read.masked is not None:
        logits.index_fill_(-1, read.masked, float("-inf"))
    return torch.log_softmax(logits, dim=-1)
