"""The backend: everything the engine changes in torch and transformers, in one object per device type.

The engine keeps a row's bits independent of its batch (adafuse/backend/invariance.py) by changing a model in a few
places, and it reaches into transformers and torch to do so. All of it is installed here, once per model
(`Backend.install`), after `check_transformers` has checked, once per process, the transformers version and
every feature the engine relies on, so that a transformers release that moves one fails at start with an
error that names it (`BackendError`), not in the middle of a run:

- every linear layer multiplies in row tiles (`tile_linear_layers`);
- the model's attention implementation is wrapped so that a merged pass can run it per request
  (`split_attention`: transformers' attention and mask registries);
- the cache layers are transformers' `DynamicLayer`s grown in place (adafuse/member/cache.py) and split per request
  (adafuse/backend/invariance.py `SplitLayer`);
- on the CPU only: the vocabulary projection multiplies in blocks (adafuse/backend/cpu/projection.py), MKL's per-thread
  thread count is looked up in libtorch (adafuse/backend/cpu/cores.py), and different models' passes of one engine step
  run side by side on threads of their own, each on its share of the cores (adafuse/engine/executor.py). On a GPU
  these are off: its kernels are launched from the engine's one thread, and a GPU picks its kernels by shape,
  which the row tiles already fix;
- loading a GGUF reads its file once (`shared_gguf_reader`).

The probes' verdicts (row tiles, one-call and fewer-thread checks) live in the backend's `probes`, backed by
a probe store on disk for this environment (adafuse/backend/probe_store.py).
"""

import contextlib
import inspect
import os
import threading
from dataclasses import dataclass

import torch
from packaging.version import Version

from adafuse.backend.cpu.cores import Cores
from adafuse.backend.cpu.projection import block_output_projection
from adafuse.backend.invariance import KernelProbes, split_attention, tile_linear_layers
from adafuse.backend.probe_store import ProbeStore
from adafuse.errors import BackendError

MIN_TRANSFORMERS = "5.23"  # older versions mis-tokenise the Gemma 3 GGUF or drop its <bos> (pyproject.toml)


@dataclass(frozen=True)
class Features:
    """What the engine found in the installed transformers (`check_transformers`)."""

    version: str


def check_transformers() -> Features:
    """The installed transformers' version and the features the engine uses, checked; BackendError names
    every one that is missing."""
    import transformers
    from transformers import cache_utils, masking_utils, modeling_gguf_pytorch_utils, modeling_utils

    missing = []
    found = transformers.__version__
    if Version(found) < Version(MIN_TRANSFORMERS):
        missing.append(f"transformers >= {MIN_TRANSFORMERS} (installed: {found})")
    for where, names in [
        (transformers, ["AttentionInterface"]),
        (modeling_utils, ["ALL_ATTENTION_FUNCTIONS", "PreTrainedModel"]),
        (
            masking_utils,
            [
                "ALL_MASK_ATTENTION_FUNCTIONS",
                "AttentionMaskInterface",
                "create_causal_mask",
                "create_sliding_window_causal_mask",
            ],
        ),
        (cache_utils, ["DynamicCache", "DynamicLayer"]),
    ]:
        missing += [f"{where.__name__}.{name}" for name in names if not hasattr(where, name)]
    if hasattr(modeling_utils, "PreTrainedModel") and not hasattr(
        modeling_utils.PreTrainedModel, "set_attn_implementation"
    ):
        missing.append("PreTrainedModel.set_attn_implementation")
    layer = getattr(cache_utils, "DynamicLayer", None)
    if layer is not None and not all(
        hasattr(layer, name) for name in ("lazy_initialization", "update", "get_seq_length")
    ):
        missing.append("DynamicLayer.lazy_initialization / update / get_seq_length")
    if "GGUFReader" in vars(modeling_gguf_pytorch_utils):
        missing.append("a GGUF reader imported when a checkpoint loads (transformers imports it at module level)")
    mask_cache_arg = ""
    if hasattr(masking_utils, "create_causal_mask"):
        params = inspect.signature(masking_utils.create_causal_mask).parameters
        mask_cache_arg = next((name for name in ("cache", "past_key_values") if name in params), "")
        absent = [p for p in ("config", "inputs_embeds", "attention_mask", "position_ids") if p not in params]
        if not mask_cache_arg or absent:
            missing.append(f"create_causal_mask's parameters {absent + ([] if mask_cache_arg else ['cache'])}")
    if missing:
        raise BackendError(
            "the installed transformers lacks what the engine relies on: "
            + "; ".join(missing)
            + f". Install transformers>={MIN_TRANSFORMERS},<6 (pyproject.toml)"
        )
    return Features(found)


@dataclass(frozen=True)
class Installed:
    """What `Backend.install` made of one model."""

    splits_attention: bool  # merged passes can run its attention per request (exact merging is possible)
    blocked_head: bool  # its vocabulary projection multiplies in blocks (the CPU)


class Backend:
    """One device type's installation: the feature check, the probes' verdicts, the CPU-only devices."""

    def __init__(self, device_type: str, store: ProbeStore | None = None):
        self.device_type = device_type
        self.features = check_transformers()
        self.cores = Cores.of_this_torch() if device_type == "cpu" else None
        self.probes = KernelProbes(store or ProbeStore.for_environment(), self.cores)
        self._installed: dict[int, Installed] = {}

    @property
    def side_by_side(self) -> bool:
        """Do different models' passes of one step run on threads of their own (the CPU, with cores to share)?
        On a GPU the one thread launches every kernel; threads would only contend for Python's lock."""
        return self.device_type == "cpu" and torch.get_num_threads() > 1

    def install(self, model) -> Installed:
        """Prepare `model` for the engine (idempotent): row tiles, the split attention, on the CPU the blocked
        head. Its outputs are its own up to each layer's summation order, which the tiles then fix."""
        if id(model) not in self._installed:
            check_model(model)
            blocked = False
            if self.device_type == "cpu":
                block_output_projection(model, self.probes)
                blocked = bool(getattr(model.get_output_embeddings(), "_adafuse_blocked", False))
            tile_linear_layers(model, self.probes)
            self._installed[id(model)] = Installed(split_attention(model), blocked)
        return self._installed[id(model)]


def check_model(model) -> None:
    """The model API the engine uses: a causal LM with a decoder body, a linear head and a KV-cache argument."""
    problems = []
    params = inspect.signature(model.forward).parameters
    if "cache" not in params and "past_key_values" not in params:
        problems.append("its forward takes neither `cache` nor `past_key_values`")
    if "position_ids" not in params:
        problems.append("its forward takes no `position_ids`")
    if not callable(getattr(model, "get_decoder", None)):
        problems.append("it has no get_decoder()")
    if not isinstance(model.get_output_embeddings(), torch.nn.Linear):
        problems.append("its output embeddings are not a torch.nn.Linear")
    if problems:
        name = type(model).__name__
        raise BackendError(f"model class {name} cannot be decoded by the engine: " + "; ".join(problems))


_BACKENDS: dict[str, Backend] = {}
_BACKENDS_LOCK = threading.Lock()


def backend_for(device: torch.device) -> Backend:
    """This process's backend for the device's type, made on first use."""
    with _BACKENDS_LOCK:
        key = torch.device(device).type
        if key not in _BACKENDS:
            _BACKENDS[key] = Backend(key)
        return _BACKENDS[key]


_GGUF_SWAP = threading.Lock()


@contextlib.contextmanager
def shared_gguf_reader():
    """transformers parses the GGUF afresh for the tokenizer, the config and the weights; parsing a 262k
    vocabulary's metadata takes most of a conversion, so the three share one read-only reader. The swap is
    module-wide, so conversions in one process take turns (threads converting two models would otherwise
    restore each other's swap). `check_transformers` checks that transformers imports the reader when a
    checkpoint loads, where the swap reaches it."""
    import gguf

    check_transformers()
    with _GGUF_SWAP:
        original, readers = gguf.GGUFReader, {}

        def shared(path, mode="r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = original(path, mode)
            return readers[key]

        gguf.GGUFReader = shared
        try:
            yield
        finally:
            gguf.GGUFReader = original
