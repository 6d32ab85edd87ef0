"""The CUDA backend's layers: a model's linear layers and RMS norms, as the forward context's `ops` asks.

A pass on a GPU multiplies each linear layer in one call over all its rows (no row tiles, no per-tile loop), with
either the stock kernel (cuBLAS) or the batch-invariant one (adafuse/backend/cuda/kernels.py `linear`), and
normalises with either the model's own RMSNorm or the batch-invariant kernel, whichever the backend chose for the
pass (adafuse/backend/cuda/choice.py `Ops`). Outside the engine's passes, and where the context names no kernel,
every layer is the model's own: `generate()` over a member's model runs stock.

Each layer is swapped for a subclass of its own class (`install`, through adafuse/backend/install.py), so that a
model keeps its types (isinstance, deep copies) and a layer reads its choice from the pass's context (the CUDA
backend's part of it, `Ops`), not from state of its own.
"""

import functools

import torch
import torch.nn.functional as F

from adafuse.backend.cuda import kernels
from adafuse.backend.forward import current
from adafuse.backend.install import swap
from adafuse.backend.live import only_live

# RMSNorm formulas the kernel reproduces, by module class name: (offset added to the weight, whether the normalised
# rows are cast to the input's dtype before the weight multiplies them). Llama-style norms cast first
# (`weight * x.to(dtype)`); Gemma's multiply by (1 + weight) in float32 and cast once.
CAST_FIRST = (0.0, True)
GEMMA = (1.0, False)
RMS_NORMS = {
    "LlamaRMSNorm": CAST_FIRST,
    "MistralRMSNorm": CAST_FIRST,
    "Qwen2RMSNorm": CAST_FIRST,
    "Qwen3RMSNorm": CAST_FIRST,
    "InternLM3RMSNorm": CAST_FIRST,
    "Gemma3RMSNorm": GEMMA,
}


class KernelLinear(torch.nn.Linear):
    """A linear layer that multiplies all of a pass's rows in one call: the batch-invariant kernel where the pass's
    ops say so, else the stock one. Only live positions are multiplied (adafuse/backend/live.py)."""

    head = False  # the vocabulary projection: logits only where the pass reads them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = current()
        ops, live = context.own, context.live
        multiply = kernels.linear if ops is not None and ops.linear else F.linear
        if not self.head and (live is None or live.index is None):  # every row is multiplied, as `only_live` would
            return multiply(x, self.weight, self.bias)  # both take x (..., in)
        return only_live(x, self.out_features, lambda flat: multiply(flat, self.weight, self.bias), self.head)


class KernelHead(KernelLinear):
    head = True


def _norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    ops = current().own
    if ops is None or not ops.rms_norm:
        return super(type(self), self).forward(x)
    return norm_kernel(self, x)


def norm_kernel(norm, x: torch.Tensor) -> torch.Tensor:
    """The batch-invariant kernel in place of a kernel-aware RMS norm's own formula (`kernel_norm`), on x."""
    offset, cast_first = norm.formula
    return kernels.rms_norm(x, norm.weight, norm_eps(norm), offset, cast_first)


def norm_eps(norm) -> float:
    """An RMS norm's epsilon: `variance_epsilon` in Llama-style norms, `eps` in Gemma's."""
    return getattr(norm, "variance_epsilon", None) or norm.eps


@functools.cache
def kernel_norm(cls: type) -> type:
    """The subclass of an RMSNorm class whose forward takes the kernel where the pass's ops say so."""
    return type(f"Kernel{cls.__name__}", (cls,), {"forward": _norm_forward, "formula": RMS_NORMS[cls.__name__]})


def install(model) -> list[str]:
    """Swap the model's linear layers and known RMS norms for the kernel-aware ones (idempotent); the norm
    classes it left as they are (their formula is not one the kernel reproduces)."""
    head = model.get_output_embeddings()
    unknown = set()
    for module in model.modules():
        cls = type(module)
        if cls is torch.nn.Linear:
            swap(model, module, KernelHead if module is head else KernelLinear)
        elif cls.__name__ in RMS_NORMS:
            swap(model, module, kernel_norm(cls))
        elif cls.__name__.endswith("RMSNorm") and not cls.__name__.startswith("Kernel"):
            unknown.add(cls.__name__)
    return sorted(unknown)


def norms(model) -> list[torch.nn.Module]:
    """The model's RMS norms that the kernel can run, one per distinct (class, width)."""
    seen, found = set(), []
    for module in model.modules():
        key = (type(module).__name__, getattr(module, "weight", torch.empty(0)).shape)
        if hasattr(type(module), "formula") and key not in seen:
            seen.add(key)
            found.append(module)
    return found
