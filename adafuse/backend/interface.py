"""The backend interface (adafuse/backend/__init__.py says what the seam is): passes as data, and the
backend that runs them."""

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# The kinds of pass, one name each, from the scheduler (adafuse/engine/scheduler.py) to the backend:
# PREFIX: a prompt's shared prefix read into an empty cache through the model's body alone (no logits);
# PROMPT: a whole prompt read from nothing, alone;
# ALONE: one read after a cache, to weights whose attention cannot be split per request (never merged);
# MERGED: one or more reads to the same weights in one packed pass, each computed exactly as in a pass of its own.
PREFIX, PROMPT, ALONE, MERGED = "prefix", "prompt", "alone", "merged"

MEMORY_SHARE = 0.8  # of the memory free at a step, what its passes may take


@dataclass(frozen=True)
class Prepared:
    """A model as its backend prepared it, and how a pass calls it."""

    model: torch.nn.Module
    device: torch.device
    cache_arg: str  # the forward's cache argument: `cache` (transformers >= 5.24) or `past_key_values`
    body: torch.nn.Module  # the layers under the vocabulary projection (a PREFIX pass)
    body_cache_arg: str
    keeps_last: bool  # its forward takes `logits_to_keep` (a prompt read makes its last position's logits alone)
    splits_attention: bool  # a MERGED pass can run its attention per request (else its reads run ALONE)


@dataclass(frozen=True, eq=False)
class Read:
    """One request's part of a pass: `input_ids` (rows, width) read after `cache`, which grows by them.

    `lengths`: row i's real ids (the rest right padding, never computed); its result is then packed,
    (sum(lengths), vocab). `last_only`: the last position's logits alone, (rows, 1, vocab). Otherwise
    (rows, width, vocab). Float32 logits, or with `logprobs` their log-softmax, the ids of `masked` at -inf.
    `input_ids` and `masked` are given on the host; the backend moves them to where it computes."""

    cache: object  # transformers' DynamicCache of adafuse/member/cache.py's layers
    input_ids: torch.Tensor
    lengths: list[int] | None = None
    last_only: bool = False
    logprobs: bool = False
    masked: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]


@dataclass(frozen=True, eq=False)
class Pass:
    """One forward pass: its kind (PREFIX, PROMPT, ALONE or MERGED), the prepared model and its reads, in row
    order."""

    kind: str
    model: Prepared
    reads: tuple[Read, ...]


@dataclass(frozen=True)
class Execution:
    """How a caller wants its passes run. `exact`: every read has the bits of its pass alone; else the stock
    kernels, up to rounding. `options`: each backend's own settings, by device type (the CPU's:
    adafuse/backend/cpu/backend.py), which no other backend reads."""

    exact: bool = True
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Ran:
    """What a pass gave: each read's result (None for a PREFIX pass), its seconds of compute, and the seconds the
    host took to run it (where the device computes apart from the host, to launch it; elsewhere the same)."""

    results: list
    seconds: float
    host_seconds: float


class Backend(ABC):
    """One device type's way of computing passes (module docstring)."""

    name: str

    @abstractmethod
    def prepare(self, model) -> Prepared:
        """Prepare `model` for this backend's passes (idempotent): its outputs stay its own up to each layer's
        summation order, which the backend then fixes."""

    @abstractmethod
    def execute(self, passes: list[Pass], how: Execution) -> list[Ran]:
        """Run the passes of one step, each model's in order, as `how` asks; what each pass gave."""

    def memory_budget(self, device: torch.device) -> int:
        """Bytes one pass on `device` may take now (the scheduler cuts merged passes to it): a share of what is free."""
        return int(self.free_memory(device) * MEMORY_SHARE)

    def free_memory(self, device: torch.device) -> int:
        """Bytes free on `device` now (the engine admits an example only where it has room): the GPU's
        (`mem_get_info`, and what torch's allocator keeps reserved but holds nothing in), else the host's available
        memory."""
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        import psutil

        return psutil.virtual_memory().available

    @abstractmethod
    def describe(self, model: Prepared, exact: bool) -> dict:
        """What a run records of a model's passes: the backend's name, whether they are batch-invariant (with
        `exact` asked), which ops failed to be, and how each op type runs."""
