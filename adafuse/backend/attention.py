"""Attention per request inside a packed pass: every request attends exactly as in its pass alone.

A merged pass (adafuse/backend/split_pass.py) is one packed row of every request's real positions. The linear
layers, norms and the rest compute each position on its own; attention must not mix requests. So the model's
attention implementation is wrapped (`wrapped_attention`, registered in transformers' attention registry): in a
packed pass (the forward context's `split`, adafuse/backend/forward.py) it runs once per request, on that
request's positions laid out again as its pass alone lays them out (`unpack`: its rows and width, zeros at its
own right padding), against the keys and values of its own cache, which grows exactly as in its pass alone
(`SplitLayer`, `SplitPass.per_request`), with the mask the pass alone would build (transformers' own mask
functions, `AloneMasks`), by the model's own attention function; the output goes back to the packed row (`pack`).
Outside a packed pass the wrapper calls the original unchanged. (adafuse/backend/install.py routes a model's
attention through it.)

On this CPU one attention call over all requests (padded) keeps no request's bits (tools/attention_probe.py);
a backend that has one that does may route a packed pass through it instead.
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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

from adafuse.backend.forward import current

PREFIX = "adafuse-split-"  # the wrapped attention implementation's name: PREFIX + the original's


@dataclass
class Span:
    """One request's place in a packed pass."""

    rows: slice  # its rows in the pass, as its pass alone has them
    length: int  # L_j: its cached positions before the pass
    width: int  # n_j: its own input width (its own right padding included, as when alone)
    start: int = 0  # its first position in the packed row
    count: int = 0  # its live positions there
    live: torch.Tensor | None = None  # their flat indices (row * width + position); None: all
    lengths: tuple[int, ...] = ()  # each row's live positions (the first of its width), row after row

    @property
    def batch(self) -> int:
        return self.rows.stop - self.rows.start


@dataclass
class SplitPass:
    """A packed pass's requests, their caches, and the layer being run: its new keys and values, set aside by
    `SplitLayer` and handed to each request's own cache just before its attention runs (`attention`). `one_call`: a
    backend's attention over every request at once, `one_call(module, query, split, kwargs) -> (output, None)`,
    for the layers where it says it can (None from it: per request, as without)."""

    spans: list[Span]
    longest: int  # the longest request's cached positions before the pass
    caches: list = field(default_factory=list)  # each request's cache
    # the layer being run: (its index, each request's cache layer, its new keys, its new values), the keys and values
    # as the model made them, (1, heads, positions, d) over the packed row
    new: tuple | None = None
    one_call: Callable | None = None
    one_call_layout: Any = None  # what `one_call` derives from `spans` once and reads in every layer

    def per_request(self) -> list[tuple]:
        """Per request: its cache layer, and its new keys and values as its pass alone lays them out (`unpack`)."""
        _, own, keys, values = self.new
        return [(layer, unpack(keys, s), unpack(values, s)) for layer, s in zip(own, self.spans, strict=True)]


def wrapped_attention(name: str) -> str | None:
    """The name of the per-request wrapper around the registered attention function `name`, registered in
    transformers' attention and mask registries on first use (adafuse/backend/install.py routes a model through
    it); None if `name` is not a registered function that can be wrapped (e.g. "eager")."""
    original = ALL_ATTENTION_FUNCTIONS.get(name) if name in ALL_ATTENTION_FUNCTIONS else None
    if original is None or name not in ALL_MASK_ATTENTION_FUNCTIONS:
        return None
    wrapped = PREFIX + name
    if wrapped not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(wrapped, _attention(original))
        AttentionMaskInterface.register(wrapped, ALL_MASK_ATTENTION_FUNCTIONS[name])  # the same masks as alone
    return wrapped


def _attention(original):
    masks = AloneMasks()

    def attention(module, query, key, value, attention_mask, **kwargs):
        """query (batch, heads, width, d); in a packed pass (1, heads, positions, d), where each request attends
        with its own cache's keys and values (key and value are only the new ones, which `SplitLayer` set
        aside): one request's at a time, so that only one request's grown keys exist at once."""
        split = current().split
        if split is None:
            return original(module, query, key, value, attention_mask, **kwargs)
        if split.one_call is not None:
            done = split.one_call(module, query, split, kwargs)
            if done is not None:
                return done
        out = query.new_empty(1, query.shape[2], query.shape[1], value.shape[-1])
        for s, (own, new_keys, new_values) in zip(split.spans, split.per_request(), strict=True):
            own_keys, own_values = own.update(new_keys, new_values)
            mask = masks.get(module.config, kwargs.get("sliding_window"), s, query)
            o, _ = original(module, unpack(query, s), own_keys, own_values, mask, **kwargs)
            out[0, s.start : s.start + s.count] = pack(o, s)
        split.new = None
        return out, None

    return attention


def unpack(x: torch.Tensor, s: Span) -> torch.Tensor:
    """Request s's part of a packed pass's (1, heads, positions, d) tensor, laid out as its pass alone lays it
    out, (rows, heads, width, d) over (rows, width, heads, d) memory, with zeros at its right padding (alone,
    the linear layers leave zeros there: adafuse/backend/live.py), so that its attention gets the very inputs it
    gets alone."""
    if s.live is None and s.batch == 1:  # one row, every position live: its positions as they are
        return x[:, :, s.start : s.start + s.count]
    part = x[0, :, s.start : s.start + s.count].transpose(0, 1)
    if s.live is not None:
        part = part.new_zeros(s.batch * s.width, *part.shape[1:]).index_copy_(0, s.live, part)
    return part.reshape(s.batch, s.width, *part.shape[1:]).transpose(1, 2)


def pack(o: torch.Tensor, s: Span) -> torch.Tensor:
    """The live positions of request s's attention output (rows, width, heads, d), in packed order."""
    flat = o.reshape(s.batch * s.width, *o.shape[2:])
    return flat if s.live is None else flat.index_select(0, s.live)


class SplitLayer(DynamicLayer):
    """Layer `index` of a packed pass's cache (`split_cache`). The model sees one cache of the longest request's
    length (it builds merged masks from it, which the split attention replaces); the pass's new keys and values are
    set aside for the requests' own cache layers, which grow exactly as in their passes alone when the attention
    that follows reads them (`SplitPass.new`). No merged copy of any cache is made."""

    def __init__(self, index: int, own: list, split: SplitPass, placeholder: torch.Tensor):
        super().__init__()
        # what `lazy_initialization` sets, less the two empty tensors it makes (each a copy to a GPU), 32 a pass
        self.device, self.is_initialized = placeholder.device, True
        self.keys, self.values = placeholder, placeholder  # (rows, 1, longest, 1), no memory: its length alone
        self.index, self.own, self.split = index, own, split

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.split.new = (self.index, self.own, key_states, value_states)
        return key_states, value_states


def split_cache(caches: list[DynamicCache], split: SplitPass) -> DynamicCache:
    """The cache a packed pass hands the model: one `SplitLayer` per layer over the requests' own caches."""
    like = next(layer for c in caches for layer in c.layers)
    placeholder = torch.zeros((), dtype=like.dtype, device=like.device).expand(1, 1, split.longest, 1)
    split.caches = caches
    packed = DynamicCache()
    for layer in range(len(caches[0].layers)):
        packed.layers.append(SplitLayer(layer, [c.layers[layer] for c in caches], split, placeholder))
    return packed


# transformers >= 5.24 names the mask functions' cache argument `cache`, 5.23 `past_key_values`
# (adafuse/backend/transformers_check.py checks that one of them is there)
_MASK_CACHE_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


class AloneMasks:
    """The masks requests' attention would get in their passes alone (None, or a tensor), kept across passes: a
    mask depends only on the model's config, its sliding window and the request's rows, width and cached length,
    and a pass asks one per request and layer kind. A mask is only ever read."""

    LIMIT = 4096  # shapes kept before the store starts afresh

    def __init__(self):
        self.kept: dict[tuple, tuple] = {}  # shape key -> (the config it was made for, the mask)

    def get(self, config, sliding_window, s: Span, query: torch.Tensor):
        key = (id(config), sliding_window, s.batch, s.width, s.length, query.dtype, query.device)
        hit = self.kept.get(key)
        if hit is not None and hit[0] is config:
            return hit[1]
        make = create_sliding_window_causal_mask if sliding_window else create_causal_mask
        mask = make(
            config=config,
            inputs_embeds=torch.empty((s.batch, s.width, 0), dtype=query.dtype, device=query.device),
            attention_mask=None,
            position_ids=None,
            **{_MASK_CACHE_ARG: _cache_of_length(s.length, query.device)},
        )
        if len(self.kept) >= self.LIMIT:
            self.kept.clear()
        self.kept[key] = (config, mask)
        return mask


def _cache_of_length(length: int, device) -> DynamicCache:
    """A cache that reports `length` positions, for the mask functions (they read its length only)."""
    cache, layer = DynamicCache(), DynamicLayer()
    empty = torch.zeros((), device=device).expand(1, 1, length, 1)
    layer.lazy_initialization(empty, empty)
    layer.keys, layer.values = empty, empty
    cache.layers.append(layer)
    return cache
