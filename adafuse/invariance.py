"""Batch-invariant merged passes: every request of a merged forward pass computed exactly as it would
be alone, so that batch_size never changes an output (README: Batching, "exact").

A merged pass (adafuse/batching.py `forward_together`) stacks requests with caches of different
lengths (left padding) and inputs of different widths (right padding). Two things made a row's
numbers depend on its batch (measured on this project's CPU; the GPU is discussed in the README):

- attention over left-padded keys with a mask is computed with other shapes, and so other rounding,
  than attention over the request's own keys (bfloat16 results differed by up to 0.7 in the logits,
  flipping greedy choices);
- a matrix multiply's kernel, and so its summation order, is picked by the number of rows (MKL's
  float32 GEMM: 1, 2-3, 4 and more rows, and a thread split of 5-11 rows), so a row multiplied
  together with others may differ in its last bits from the same row alone.

So inside a merged pass (`split_pass`):
1. attention runs once per request, on the request's rows, its own query positions, its unpadded
   keys and values, with the mask the pass alone would build (transformers' own mask functions), by
   the model's own attention function: the model's attention implementation is wrapped
   (`split_attention`), and outside a merged pass the wrapper calls the original unchanged;
2. where the model's linear layers are not row-invariant on this device and dtype (`linear_is_row_invariant`,
   probed once per model with its own weights and shapes), each linear layer multiplies each
   request's rows as its own matrix (`split_linear`): the same number of rows as alone, so the same
   kernel. Where they are invariant (bfloat16 on a CPU without native bfloat16: one kernel for any
   number of rows) the merged multiply is kept, and batching keeps its whole gain.

Every other layer (norms, rotary embeddings, the softmax) computes each row on its own already.
A model whose attention cannot be wrapped (its implementation is not in transformers' attention
registry, e.g. "eager") is never merged when exactness is asked for: its requests run alone.
"""

import contextlib
import contextvars
import functools
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    AttentionMaskInterface,
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

PREFIX = "adafuse-split-"  # the wrapped attention implementation's name: PREFIX + the original's
PROBE_ROWS = (1, 2, 3, 4, 5, 6, 8, 11, 16, 24, 32)  # row counts a merged pass may give a linear layer


@dataclass
class Span:
    """One request's place in a merged pass."""

    rows: slice  # its rows in the merged batch
    length: int  # L_j: its cached positions before the pass (it is left-padded to the longest)
    width: int  # n_j: its own input width (its own right padding included, as when alone)


@dataclass
class Plan:
    spans: list[Span]
    longest: int  # the merged cache's length before the pass
    split_linear: bool
    masks: dict = field(default_factory=dict)  # (request, sliding window) -> the mask it would have alone


_PLAN: contextvars.ContextVar = contextvars.ContextVar("adafuse_split_pass", default=None)


@contextlib.contextmanager
def split_pass(spans: list[Span], longest: int, split_linear: bool):
    """Inside this block, the wrapped attention (and linear layers) of any model compute per request."""
    token = _PLAN.set(Plan(spans, longest, split_linear))
    try:
        yield
    finally:
        _PLAN.reset(token)


# ---- attention ----------------------------------------------------------------------------------


def split_attention(model) -> bool:
    """Route the model's attention through the per-request wrapper (idempotent); False if its
    implementation is not a registered attention function that can be wrapped."""
    config = model.config
    name = config._attn_implementation
    if name.startswith(PREFIX):
        return True
    original = ALL_ATTENTION_FUNCTIONS.get(name) if name in ALL_ATTENTION_FUNCTIONS else None
    if original is None or name not in ALL_MASK_ATTENTION_FUNCTIONS:
        return False
    wrapped = PREFIX + name
    if wrapped not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(wrapped, _attention(original))
        AttentionMaskInterface.register(wrapped, ALL_MASK_ATTENTION_FUNCTIONS[name])  # the same masks as alone
    model.set_attn_implementation(wrapped)
    return True


def _attention(original):
    def attention(module, query, key, value, attention_mask, **kwargs):
        """query (batch, heads, width, d); key, value (batch, kv_heads, longest + width, d)."""
        plan = _PLAN.get()
        if plan is None:
            return original(module, query, key, value, attention_mask, **kwargs)
        batch, heads, width, _ = query.shape
        out = query.new_zeros(batch, width, heads, value.shape[-1])
        for j, s in enumerate(plan.spans):
            own = slice(plan.longest - s.length, plan.longest + s.width)
            mask = _alone_mask(plan, j, module.config, kwargs.get("sliding_window"), query)
            o, _ = original(
                module, query[s.rows, :, : s.width], key[s.rows, :, own], value[s.rows, :, own], mask, **kwargs
            )
            out[s.rows, : s.width] = o
        return out, None

    return attention


def _alone_mask(plan: Plan, j: int, config, sliding_window, query: torch.Tensor):
    """The mask request j's attention would get if its pass ran alone (None, or a tensor)."""
    key = (j, sliding_window)
    if key not in plan.masks:
        s = plan.spans[j]
        rows = s.rows.stop - s.rows.start
        make = create_sliding_window_causal_mask if sliding_window else create_causal_mask
        plan.masks[key] = make(
            config=config,
            inputs_embeds=torch.empty((rows, s.width, 0), dtype=query.dtype, device=query.device),
            attention_mask=None,
            cache=_cache_of_length(s.length, query.device),
            position_ids=None,
        )
    return plan.masks[key]


def _cache_of_length(length: int, device) -> DynamicCache:
    """A cache that reports `length` positions, for the mask functions (they read its length only)."""
    cache, layer = DynamicCache(), DynamicLayer()
    empty = torch.zeros((), device=device).expand(1, 1, length, 1)
    layer.lazy_initialization(empty, empty)
    layer.keys, layer.values = empty, empty
    cache.layers.append(layer)
    return cache


# ---- linear layers ------------------------------------------------------------------------------


def linear_is_row_invariant(model) -> bool:
    """Does each of the model's linear layers give a row the same bits whatever the number of rows
    multiplied with it? Probed once per model, with its own weights, shapes, dtype and device."""
    if not hasattr(model, "_adafuse_rows_invariant"):
        shapes = {}
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                shapes.setdefault((module.in_features, module.out_features, module.bias is not None), module)
        generator = torch.Generator(device="cpu").manual_seed(0)
        model._adafuse_rows_invariant = all(_rows_invariant(m, generator) for m in shapes.values())
    return model._adafuse_rows_invariant


@torch.inference_mode()
def _rows_invariant(module: torch.nn.Linear, generator) -> bool:
    weight = module.weight
    x = torch.randn(max(PROBE_ROWS), weight.shape[1], generator=generator).to(weight.device, weight.dtype)
    full = module.forward(x)  # the layer's own multiply (adafuse/projection.py blocks the output embeddings')
    for rows in PROBE_ROWS:
        for start in {0, max(PROBE_ROWS) - rows}:
            if not torch.equal(module.forward(x[start : start + rows]), full[start : start + rows]):
                return False
    return True


def split_linear(model) -> None:
    """Give every linear layer of the model a forward that, inside a split pass that asks for it,
    multiplies each request's rows on their own (idempotent, and cheap to repeat: every merged pass asks
    for it; outside such a pass it is the layer's own forward)."""
    if getattr(model, "_adafuse_split_linear", False):
        return
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not getattr(module, "_adafuse_split", False):
            module.forward = functools.partial(_linear, module, module.forward)
            module._adafuse_split = True
    model._adafuse_split_linear = True


def _linear(module: torch.nn.Linear, multiply, x: torch.Tensor) -> torch.Tensor:
    """`multiply` is the layer's forward before it was split: F.linear, or the blocked projection."""
    plan = _PLAN.get()
    if plan is None or not plan.split_linear:
        return multiply(x)
    out = x.new_zeros(*x.shape[:-1], module.out_features)  # right padding beyond a request: never read
    for s in plan.spans:  # (b_j, n_j, in) as alone: the same rows, so the same kernel
        out[s.rows, : s.width] = multiply(x[s.rows, : s.width])
    return out
