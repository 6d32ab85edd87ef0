"""The CUDA backend: a model's passes on a GPU, each layer in one call, batch-invariant where the GPU allows and
said so where it does not.

- `prepare`: a model's linear layers and RMS norms become kernel-aware (adafuse/backend/cuda/layers.py), its
  attention is wrapped for packed passes (adafuse/backend/attention.py), and its op types are probed on its device
  (adafuse/backend/cuda/choice.py): which kernels keep a row's bits, kept in a store named by the GPU's facts.
- `execute`: every read that reads after a cache goes through the packed pass (adafuse/backend/split_pass.py),
  alone or merged, so that a read alone and among others run the very same kernels; attention in one
  variable-length call per layer where the choice says so. A step's passes are launched model after model with no
  wait between them (members on different GPUs overlap), then each GPU is synchronised once, and every result is
  copied to the host in the same step: the programs read their scalars there, without a sync of their own.
- each pass's seconds: on the GPU, from CUDA events, its first kernel's start to its last's end (idle gaps between
  launches included: a pass the host cannot launch fast enough reads as long as its launching), and on the host, how
  long launching it took; where the two are alike, the host bounds the pass. The memory a step may take comes from
  the device's free memory (`torch.cuda.mem_get_info`).
- what Triton lacks here (a C compiler, the Python headers, a writable cache: adafuse/backend/cuda/toolchain.py) is
  said once at start, in one line with its fix, and recorded with every model's choice.

On a CPU tensor (the tests, with Triton's interpreter) the same code runs the kernels' logic without a GPU.
"""

import contextlib
import logging
import time
import weakref

import torch

from adafuse.backend.calls import (
    alone_pass,
    finish,
    kept_while_used,
    prefix_pass,
    prepared_for,
)
from adafuse.backend.cuda import layers, toolchain
from adafuse.backend.cuda.attention import IN_PLACE, packed_attention, torch_varlen
from adafuse.backend.cuda.choice import Choice, decide
from adafuse.backend.forward import ForwardContext
from adafuse.backend.interface import ALONE, MERGED, PREFIX, PROMPT, Backend, Execution, Pass, Prepared, Ran
from adafuse.backend.probe_store import ProbeStore
from adafuse.backend.split_pass import merged_pass
from adafuse.backend.transformers_check import check_model, check_transformers

log = logging.getLogger(__name__)


class CudaBackend(Backend):
    """`stock_attention`: torch's one-call attention in `packed_attention`'s shape (default: its FlashAttention
    variable-length kernel on a GPU, none elsewhere)."""

    def __init__(self, device_type: str = "cuda", store: ProbeStore | None = None, stock_attention=...):
        self.device_type = device_type
        self.name = "cuda"
        check_transformers()
        self._store = store
        self._prepared = kept_while_used()
        # per model, as long as it lives: what its passes use on its GPU
        self.choices: weakref.WeakKeyDictionary[torch.nn.Module, Choice] = weakref.WeakKeyDictionary()
        if stock_attention is ...:
            stock_attention = torch_varlen() if device_type == "cuda" else None
        self._stock_varlen = stock_attention
        # a split pass's attention in one call, by the choice's name for it (per_request: none)
        self._one_calls = {"kernel": IN_PLACE, "stock": packed_attention(self._stock_varlen)}
        # a launch on a GPU builds Triton's launcher; the interpreter (CPU tensors) builds nothing
        self.toolchain = toolchain.problems() if device_type == "cuda" else []
        if self.toolchain:
            log.warning("the CUDA backend's kernels cannot run here, stock kernels only: %s", "; ".join(self.toolchain))

    def prepare(self, model) -> Prepared:
        prepared = self._prepared.get(id(model))
        if prepared is None:
            check_model(model)
            unknown = layers.install(model)
            prepared = prepared_for(model)
            store = self._store or ProbeStore.for_gpu(model.device, toolchain.source_hash())
            with _on(model.device):  # the probes launch on the model's GPU
                self.choices[model] = decide(model, model.device, unknown, self._stock_varlen, store, self.toolchain)
            self._prepared[id(model)] = prepared
        return prepared

    def execute(self, passes: list[Pass], how: Execution) -> list[Ran]:
        timings, outputs = [], []
        for p in passes:  # every model's passes launched, none waited for
            ops = self.choices[p.model.model].ops(how.exact)
            context = ForwardContext(own=ops)
            # Triton launches, and CUDA events record, on the current device's stream: the pass's own GPU
            with _on(p.model.device):
                launched = time.perf_counter()
                start, end = _marks(p.model.device)
                results = self._run(p, context, self._one_calls.get(ops.attention))
                timings.append((start, end(), p.model.device, time.perf_counter() - launched))
                outputs.append([_to_host(r) for r in results])
        for device in {t[2] for t in timings if t[2].type == "cuda"}:
            torch.cuda.synchronize(device)  # once per GPU and step, every model's passes launched before it
        return [Ran(results, _seconds(t), t[3]) for results, t in zip(outputs, timings)]

    def _run(self, p: Pass, context: ForwardContext, one_call) -> list:
        with torch.inference_mode():
            if p.kind == PREFIX:
                return prefix_pass(p, context)
            if p.kind in (PROMPT, ALONE):  # read from nothing, or by weights whose attention cannot be split
                return [finish(p.reads[0], alone_pass(p.model, p.reads[0], context))]
            if p.kind != MERGED:
                raise ValueError(f"a pass is {PREFIX!r}, {PROMPT!r}, {ALONE!r} or {MERGED!r}, not {p.kind!r}")
            # one read or several, the packed pass: the very same kernels whoever shares it
            logits = merged_pass(p.model, list(p.reads), context, one_call)
            return [finish(read, result) for read, result in zip(p.reads, logits)]

    def describe(self, model: Prepared, exact: bool) -> dict:
        return self.choices[model.model].describe(exact)


def _on(device: torch.device):
    """`device` made the current CUDA device for what runs inside (nothing to do off a GPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _marks(device: torch.device):
    """A pass's start mark and a function that makes its end mark: CUDA events on a GPU, else the host clock."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        start.record()

        def end():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        return start, end
    started = time.perf_counter()
    return started, time.perf_counter


def _seconds(timing) -> float:
    start, end, device, _ = timing
    return start.elapsed_time(end) / 1000 if device.type == "cuda" else end - start


def _to_host(result):
    """A read's result, copied to pinned host memory without waiting: the step's one sync ends the copy, and the
    programs then read scalars and whole distributions there without waiting on the GPU again."""
    if result is None or result.device.type == "cpu":
        return result
    host = torch.empty(result.shape, dtype=result.dtype, pin_memory=True)
    return host.copy_(result, non_blocking=True)
