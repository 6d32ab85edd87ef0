"""Batch-invariant merged passes: every request of a merged forward pass computed exactly as it would
be alone, so that batch_size never changes an output (docs/speed.md, "Exact batching").

A merged pass (adafuse/backend/split_pass.py `forward_together`) stacks requests with caches of different
lengths and inputs of different widths (right padding). Two things made a row's numbers depend on
its batch (measured on this project's CPU; docs/speed.md says what holds on a GPU):

- attention over left-padded keys with a mask is computed with other shapes, and so other rounding,
  than attention over the request's own keys (bfloat16 results differed by up to 0.7 in the logits,
  flipping greedy choices);
- a matrix multiply's kernel, and so its summation order, is picked by the number of rows (MKL's
  float32 GEMM: 1, 2-3 and 4 or more rows, and with 2 threads a split of 5-7 and 9-11 rows), so a
  row multiplied together with others may differ in its last bits from the same row alone.

So:
1. a merged pass (`split_pass`) runs as one packed row of every request's real positions, no padding
   between them (adafuse/backend/split_pass.py), and attention runs once per request: its positions are laid
   out again as its pass alone lays them out (`unpack`: its rows and width, zeros at its own right
   padding, where the linear layers of a pass alone leave zeros), attend to the keys and values of its
   own cache, which grows exactly as in its pass alone (`split_cache`: no merged cache is built), with
   the mask the pass alone would build (transformers' own mask functions), by the model's own attention
   function, and go back to the packed row (`pack`). The model's attention implementation is wrapped
   (`split_attention`); outside a merged pass the wrapper calls the original unchanged;
2. every linear layer, in every pass, alone or merged, multiplies its rows in fixed row tiles
   (`tiled_linear`, installed on each member's model by `tile_linear_layers`): the rows are
   zero-padded to a whole number of tiles of `tile_rows` rows, so a row's bits are those of its tile,
   whoever shares the tile and wherever the row sits in it. Where one multiply of all the padded rows
   gives every tile's bits (probed once per kernel and row count: `one_call_is_tiled`), the rows are
   multiplied in one call, which is what a merged pass costs without exactness; otherwise tile by tile.
   The tile size is probed once per device, dtype, weight shape and thread count (`tile_rows`); on
   this CPU it is 4 rows in float32 (MKL's kernel for 4 or more rows, with no row-count-dependent
   split) and 1 or 2 in bfloat16. A thread that shares the cores with another (adafuse/backend/cpu/cores.py)
   multiplies on fewer MKL threads only where a probe shows the same bits (`linear`).

The tiles change the canonical computation itself: a pass of one row is multiplied as a tile of
`tile_rows` rows (one real, the rest zeros), not by the one-row kernel, in every pass of a member,
alone or batched, in `generate()` over the member's model too. A merged pass then makes the same
number of multiplies as a pass alone (tests/engine/test_invariance.py counts them).

Every other layer (norms, rotary embeddings, the softmax) computes each position on its own already, so
a position's bits do not depend on its neighbours in the packed row. A pass alone of rows of unequal
length (`live_positions`) keeps its padded layout, but its linear layers multiply only each row's real
positions, not the right padding after them, and the vocabulary projection makes logits for those alone
(`only_live`, `packed_logits`); a packed pass makes logits where `packed_positions` says.
A model whose attention cannot be wrapped (its implementation is not in transformers' attention
registry, e.g. "eager") is never merged when exactness is asked for: its requests run alone.
"""

import contextlib
import contextvars
import functools
import inspect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    AttentionMaskInterface,
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from adafuse.backend.cpu.cores import Cores
from adafuse.backend.probe_store import ProbeStore, Verdicts

PREFIX = "adafuse-split-"  # the wrapped attention implementation's name: PREFIX + the original's
TILE_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)  # row tiles tried, fewest first (a GPU may need large ones)
PROBE_ROWS = 64  # the one multiply a tile size must agree with (a multiple of every candidate)


@dataclass
class Span:
    """One request's place in a merged pass."""

    rows: slice  # its rows in the merged batch
    length: int  # L_j: its cached positions before the pass
    width: int  # n_j: its own input width (its own right padding included, as when alone)
    start: int = 0  # a split pass: its first position in the packed sequence
    count: int = 0  # a split pass: its live positions there
    live: torch.Tensor | None = None  # a split pass: their flat indices (row * width + position); None: all

    @property
    def batch(self) -> int:
        return self.rows.stop - self.rows.start


@dataclass
class Plan:
    spans: list[Span]
    longest: int  # the longest request's cached positions before the pass
    kv: list = field(default_factory=list)  # the layer being run: each request's keys and values (`SplitLayer`)


_PLAN: contextvars.ContextVar = contextvars.ContextVar("adafuse_split_pass", default=None)


@contextlib.contextmanager
def split_pass(spans: list[Span], longest: int):
    """Inside this block, the wrapped attention of any model computes per request."""
    token = _PLAN.set(Plan(spans, longest))
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
    masks = AloneMasks()

    def attention(module, query, key, value, attention_mask, **kwargs):
        """query (batch, heads, width, d); in a split pass (1, heads, positions, d), the packed row, where
        each request attends with its own cache's keys and values, which its `SplitLayer` has just handed
        over (key and value are only the new ones)."""
        plan = _PLAN.get()
        if plan is None:
            return original(module, query, key, value, attention_mask, **kwargs)
        out = query.new_empty(1, query.shape[2], query.shape[1], value.shape[-1])
        for s, (own_keys, own_values) in zip(plan.spans, plan.kv, strict=True):
            mask = masks.get(module.config, kwargs.get("sliding_window"), s, query)
            o, _ = original(module, unpack(query, s), own_keys, own_values, mask, **kwargs)
            out[0, s.start : s.start + s.count] = pack(o, s)
        plan.kv = []
        return out, None

    return attention


def unpack(x: torch.Tensor, s: Span) -> torch.Tensor:
    """Request s's part of a split pass's (1, heads, positions, d) tensor, laid out as its pass alone lays it
    out, (rows, heads, width, d) over (rows, width, heads, d) memory, with zeros at its right padding (alone,
    the linear layers leave zeros there: `only_live`), so that its attention gets the very inputs it gets alone."""
    part = x[0, :, s.start : s.start + s.count].transpose(0, 1)
    if s.live is not None:
        part = part.new_zeros(s.batch * s.width, *part.shape[1:]).index_copy_(0, s.live, part)
    return part.reshape(s.batch, s.width, *part.shape[1:]).transpose(1, 2)


def pack(o: torch.Tensor, s: Span) -> torch.Tensor:
    """The live positions of request s's attention output (rows, width, heads, d), in packed order."""
    flat = o.reshape(s.batch * s.width, *o.shape[2:])
    return flat if s.live is None else flat.index_select(0, s.live)


class SplitLayer(DynamicLayer):
    """One layer of a split pass's cache (`split_cache`). The model sees one cache of the longest request's
    length (it builds merged masks from it, which the split attention replaces); each request's new keys
    and values go to that request's own cache layer, which grows exactly as in its pass alone, and the
    attention that follows reads them from there (`Plan.kv`). No merged copy of any cache is made."""

    def __init__(self, own: list[DynamicLayer], spans: list[Span], placeholder: torch.Tensor):
        super().__init__()
        self.lazy_initialization(placeholder, placeholder)
        self.keys, self.values = placeholder, placeholder  # (rows, 1, longest, 1), no memory: its length alone
        self.own, self.spans = own, spans

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        _PLAN.get().kv = [
            own.update(unpack(key_states, s), unpack(value_states, s), *args, **kwargs)
            for own, s in zip(self.own, self.spans)
        ]
        return key_states, value_states


def split_cache(caches: list[DynamicCache], spans: list[Span], longest: int) -> DynamicCache:
    """The cache a split pass hands the model (one packed row): one `SplitLayer` per layer over the requests'
    own caches."""
    like = caches[0].layers[0].keys
    placeholder = like.new_zeros(()).expand(1, 1, longest, 1)
    split = DynamicCache()
    for layer in range(len(caches[0].layers)):
        split.layers.append(SplitLayer([c.layers[layer] for c in caches], spans, placeholder))
    return split


# transformers >= 5.24 names the mask functions' cache argument `cache`, 5.23 `past_key_values`
# (adafuse/backend/__init__.py checks that one of them is there)
_MASK_CACHE_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


class AloneMasks:
    """The masks requests' attention would get in their passes alone (None, or a tensor), kept across passes: a
    mask depends only on the model's config, its sliding window and the request's rows, width and cached length,
    and a pass asks one per request and layer kind. A mask is only ever read."""

    LIMIT = 4096  # shapes kept before the store starts afresh

    def __init__(self):
        self.kept: dict[tuple, tuple] = {}  # shape key -> (the config it was made for, the mask)

    def get(self, config, sliding_window, s: "Span", query: torch.Tensor):
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


# ---- linear layers ------------------------------------------------------------------------------


class KernelProbes:
    """The verdicts of this module's probes, one table each, backed by a probe store (adafuse/backend/probe_store.py),
    and the CPU cores a multiply may share (adafuse/backend/cpu/cores.py; None off the CPU). The backend owns one per
    process and device type (adafuse/backend/__init__.py); every wrapped layer reads it."""

    def __init__(self, store: ProbeStore, cores: Cores | None):
        self.tile_rows = Verdicts("tile_rows", store)  # kernel key -> the rows of its tile
        self.one_call = Verdicts(
            "one_call", store
        )  # (kernel key, padded rows) -> does one call give every tile's bits?
        self.fewer_threads = Verdicts("fewer_threads", store)  # (kernel key, rows, MKL threads) -> all threads' bits?
        self.batched_blocks = Verdicts("batched_blocks", store)  # (block kernel key, rows, MKL threads) -> blockwise?
        self.cores = cores

    def __deepcopy__(self, memo) -> "KernelProbes":
        """The process's own: a deep copy of a model whose layers read it (tools/testing.py `narrow_window`)
        reads the same verdicts, which hold for every weight of a kernel key."""
        return self


def tile_linear_layers(model, probes: KernelProbes) -> None:
    """Make every linear layer of the model multiply in row tiles (`tiled_linear`), alone and merged
    alike (idempotent). The output embeddings, if blocked (adafuse/backend/cpu/projection.py), tile each block.
    A model whose weights are not materialised (the meta device) is left alone: nothing to probe."""
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or module.weight.device.type == "meta":
            continue
        if not getattr(module, "_adafuse_blocked", False) and not getattr(module, "_adafuse_tiled", False):
            head = module is model.get_output_embeddings()
            module.forward = functools.partial(_tiled_forward, module, head, probes)
            module._adafuse_tiled = True


def _tiled_forward(module: torch.nn.Linear, head: bool, probes: KernelProbes, x: torch.Tensor) -> torch.Tensor:
    return only_live(x, module.weight.shape[0], lambda flat: _planned_rows(module, probes, flat), head)


def _planned_rows(module: torch.nn.Linear, probes: KernelProbes, flat: torch.Tensor) -> torch.Tensor:
    """`_tiled_rows` for one of the model's layers, its decisions for a row count (tile, one call or tile by
    tile, MKL threads) kept on the layer: a pass asks them of every layer, and looking the probes' verdicts up
    again costs more than the multiply of a few rows on a GPU. They are the verdicts `_tiled_rows` reads."""
    weight, bias = module.weight, module.bias
    share = probes.cores.blas_threads() if probes.cores is not None else None
    key = (weight.data_ptr(), flat.shape[0], torch.get_num_threads(), share)
    plans = module.__dict__.setdefault("_adafuse_plans", {})
    plan = plans.get(key)
    if plan is None:
        tile = tile_rows(probes, weight, bias)
        padded = -(-flat.shape[0] // tile) * tile
        whole = one_call_is_tiled(probes, weight, bias, padded)
        plan = plans[key] = (tile, padded, whole, linear_threads(probes, weight, bias, padded if whole else tile))
    tile, padded, whole, threads = plan
    rows = flat.shape[0]
    x = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])]) if padded > rows else flat
    with probes.cores.mkl_threads(threads) if threads is not None else contextlib.nullcontext():
        if whole:
            return F.linear(x, weight, bias)[:rows]
        return torch.cat([F.linear(part, weight, bias) for part in x.split(tile)])[:rows]


def tiled_linear(
    probes: KernelProbes, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False
) -> torch.Tensor:
    """F.linear(x, weight, bias), every row computed with the bits it gets in a tile of `tile_rows` rows
    whatever the other rows: the rows are zero-padded to a whole number of tiles and multiplied in one
    call where that call is probed to give each tile's bits (`one_call_is_tiled`), else tile by tile.
    Inside `live_positions`, only the live positions are multiplied (`only_live`; `pack`: the model's
    vocabulary projection)."""
    return only_live(x, weight.shape[0], lambda flat: _tiled_rows(probes, flat, weight, bias), pack)


def _tiled_rows(probes: KernelProbes, flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    return multiply_in_tiles(probes, pad_to_tiles(probes, flat, weight, bias), weight, bias)[: flat.shape[0]]


def pad_to_tiles(probes: KernelProbes, flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """The rows (rows, in) followed by zero rows up to a whole number of this multiply's tiles."""
    tile = tile_rows(probes, weight, bias)
    missing = -flat.shape[0] % tile
    return torch.cat([flat, flat.new_zeros(missing, flat.shape[1])]) if missing else flat


def multiply_in_tiles(
    probes: KernelProbes, padded: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Rows already padded to whole tiles (`pad_to_tiles`): one call where it keeps each tile's bits,
    else tile by tile. (Calls of PROBE_ROWS rows, each probed, were tried for the second case: on the
    paper pair in shape in bfloat16 one request of 64 still came out a bfloat16 step apart, so a probe
    of a part of a larger pass is not trusted.)"""
    if one_call_is_tiled(probes, weight, bias, padded.shape[0]):
        return linear(probes, padded, weight, bias)
    tile = tile_rows(probes, weight, bias)
    return torch.cat([linear(probes, part, weight, bias) for part in padded.split(tile)])


def linear(probes: KernelProbes, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) on the calling thread's share of the cores (`linear_threads`)."""
    threads = linear_threads(probes, weight, bias, x.shape[0])
    if threads is None:
        return F.linear(x, weight, bias)
    with probes.cores.mkl_threads(threads):
        return F.linear(x, weight, bias)


def linear_threads(probes: KernelProbes, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> int | None:
    """The MKL threads a multiply of `rows` rows runs on: the calling thread's share of the cores
    (adafuse/backend/cpu/cores.py), where a probe shows that the fewer threads give the same bits
    (`fewer_threads_keep_bits`); else None, all of them."""
    if probes.cores is None or weight.device.type != "cpu" or weight.dtype not in _MKL_DTYPES:
        return None
    threads = probes.cores.blas_threads()
    if threads is not None and not fewer_threads_keep_bits(probes, weight, bias, rows, threads):
        return None
    return threads


def _kernel_key(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """What picks a multiply's kernel, values aside: device, dtype, shape, layout and threads."""
    return (
        weight.device,
        weight.dtype,
        tuple(weight.shape),
        weight.stride(),
        bias is not None,
        torch.get_num_threads(),
    )


_MKL_DTYPES = (torch.float32, torch.float64)  # the CPU multiplies MKL runs (bfloat16 runs in oneDNN)


def tile_rows(probes: KernelProbes, weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """The rows of a tile for this kernel: the fewest (of TILE_CANDIDATES) such that a row gets the same
    bits at any place in a tile, beside any rows, as alone in a tile of zeros, and tile-by-tile bits
    equal one multiply of PROBE_ROWS rows (so that merged passes multiply in one call). Where no size
    agrees with the one multiply, the largest position-invariant one: passes then loop over tiles.
    Probed once per kernel key (device, dtype, shape, threads), not per model, and kept in the probe store."""

    def probe() -> int:
        with torch.inference_mode():
            x = _probe_input(PROBE_ROWS, weight, seed=0)
            whole = F.linear(x, weight, bias)
            agreeing = (
                t
                for t in TILE_CANDIDATES
                if torch.equal(_tile_by_tile(x, weight, bias, t), whole) and _position_invariant(x, weight, bias, t)
            )
            steady = (t for t in reversed(TILE_CANDIDATES) if _position_invariant(x, weight, bias, t))
            return next(agreeing, None) or next(steady)

    return probes.tile_rows.get_or_probe(_kernel_key(weight, bias), probe)


def one_call_is_tiled(probes: KernelProbes, weight: torch.Tensor, bias: torch.Tensor | None, padded_rows: int) -> bool:
    """Does one multiply of `padded_rows` rows give every row the bits of its tile? Probed once per kernel
    key and row count, on first use (or read from the probe store, where the same environment probed it):
    every row count a pass reaches is checked, none assumed."""
    tile = tile_rows(probes, weight, bias)
    if padded_rows <= tile:
        return True

    def probe() -> bool:
        with torch.inference_mode():
            x = _probe_input(padded_rows, weight, seed=padded_rows)
            return torch.equal(F.linear(x, weight, bias), _tile_by_tile(x, weight, bias, tile))

    return probes.one_call.get_or_probe((_kernel_key(weight, bias), padded_rows), probe)


def fewer_threads_keep_bits(
    probes: KernelProbes, weight: torch.Tensor, bias: torch.Tensor | None, rows: int, threads: int
) -> bool:
    """Does a multiply of `rows` rows on `threads` MKL threads give the bits it gets on all of them? Probed
    once per kernel key, row count and thread count, on first use (or read from the probe store)."""

    def probe() -> bool:
        with torch.inference_mode():
            x = _probe_input(rows, weight, seed=rows)
            with probes.cores.mkl_threads(threads):
                fewer = F.linear(x, weight, bias)
            return torch.equal(fewer, F.linear(x, weight, bias))

    return probes.fewer_threads.get_or_probe((_kernel_key(weight, bias), rows, threads), probe)


def block_products(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """x (rows, in) times each of `blocks` (n, out, in): (n, rows, out), block i's product as F.linear(x,
    blocks[i]) where `batched_blocks_keep_bits` says so. One call: no Python, and no lock, between blocks."""
    return torch.bmm(x.expand(blocks.shape[0], *x.shape), blocks.transpose(1, 2))


def batched_blocks_keep_bits(probes: KernelProbes, blocks: torch.Tensor, rows: int, threads: int | None) -> bool:
    """Does `block_products` give each block of `rows` rows the bits of F.linear by that block, both on
    `threads` MKL threads (None: all)? Probed once per block kernel key, row count and thread count, on
    first use (or read from the probe store), on three of the blocks."""

    def probe() -> bool:
        with torch.inference_mode(), probes.cores.mkl_threads(threads):
            x = _probe_input(rows, blocks[0], seed=rows)
            batched = block_products(x, blocks[:3])
            return all(torch.equal(batched[i], F.linear(x, blocks[i])) for i in range(batched.shape[0]))

    return probes.batched_blocks.get_or_probe((_kernel_key(blocks[0], None), rows, threads), probe)


def _probe_input(rows: int, weight: torch.Tensor, seed: int) -> torch.Tensor:
    """Random rows that make a change in a multiply's summation order show in its output, even rounded to
    bfloat16. Every other row also holds a pair of large terms that cancel exactly in one output j
    (x[k1] = c * W[j, k2], x[k2] = -c * W[j, k1]), so how the small terms are summed around them decides
    that output's low bits, and a kernel that groups the inner dimension otherwise gives another value.
    The plain rows keep every output of theirs small, and sensitive to the last bits of each term.
    (Plain random rows alone let two orders agree once rounded to bfloat16's 8 bits: a probe of 320 rows
    passed whose multiply then gave a real row a bfloat16 step apart.)"""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, weight.shape[1], generator=generator)
    w = weight.detach().float().cpu()
    for i in range(1, rows, 2):
        j = int(torch.randint(w.shape[0], (), generator=generator))
        k1, k2 = torch.randperm(w.shape[1], generator=generator)[:2].tolist()
        pair = w[j, k1] * w[j, k2]
        if pair == 0:
            continue
        # a power of two, so that each term is exact and the pair cancels exactly: about 2^16 times the small terms
        small = float(w[j].abs().mean()) * weight.shape[1] ** 0.5
        c = 2.0 ** round(torch.log2(torch.tensor(2.0**16 * small / abs(float(pair)))).item())
        x[i, k1], x[i, k2] = c * w[j, k2], -c * w[j, k1]
    return x.to(weight.device, weight.dtype)


def _tile_by_tile(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: int) -> torch.Tensor:
    return torch.cat([F.linear(part, weight, bias) for part in x.split(tile)])


def _position_invariant(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: int) -> bool:
    """x[0] placed at every position of a tile among other rows of x gets the bits it gets alone, first
    in a tile of zeros (a pass of one row, padded)."""
    row, others = x[:1], x[1:tile]
    alone = F.linear(torch.cat([row, x.new_zeros(tile - 1, x.shape[1])]), weight, bias)[0]
    for place in range(tile):
        shared = torch.cat([others[:place], row, others[place:]])
        if not torch.equal(F.linear(shared, weight, bias)[place], alone):
            return False
    return True


# ---- live positions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LivePositions:
    """The positions of a pass whose results are read: (rows, width) of the pass's input, and the flat
    indices (row * width + position) of the live ones (None: every one, a split pass's packed row)."""

    shape: tuple[int, int]
    index: torch.Tensor | None
    logits: torch.Tensor  # the flat indices whose logits are made: the live ones, or a row's last where asked


_LIVE: contextvars.ContextVar = contextvars.ContextVar("adafuse_live_positions", default=None)


@contextlib.contextmanager
def live_positions(lengths: list[int] | None, width: int, device, last: list[bool] | None = None):
    """Inside this block, a pass of len(lengths) rows of `width` positions reads only the first lengths[i]
    positions of row i: its linear layers multiply those alone (`only_live`), since a row right-padded
    after its real tokens never lets them see the padding. A forward pass of every row of a fork,
    branches that ended early and candidates of unequal length included, then costs what its real
    tokens cost. `last[i]`: the vocabulary projection makes row i's logits at its last live position
    alone (a prompt's tail, or ids read for the distribution after them, sharing a merged pass).
    `lengths` None, or all full with no `last`: every position is live and nothing changes."""
    last = last or [False] * (0 if lengths is None else len(lengths))
    if lengths is None or all(n >= width for n in lengths) and not any(last):
        yield
        return
    positions, ends = torch.arange(width), torch.tensor(lengths)[:, None]
    live = positions < ends
    index = logits = live_index(lengths, width, device)
    if any(last):
        read = live & (positions >= torch.where(torch.tensor(last)[:, None], ends - 1, 0))
        logits = read.flatten().nonzero().squeeze(1).to(device)
    token = _LIVE.set(LivePositions((len(lengths), width), index, logits))
    try:
        yield
    finally:
        _LIVE.reset(token)


def live_index(lengths: list[int], width: int, device) -> torch.Tensor:
    """The flat indices (row * width + position) of the first lengths[i] positions of each row i."""
    return (torch.arange(width) < torch.tensor(lengths)[:, None]).flatten().nonzero().squeeze(1).to(device)


@contextlib.contextmanager
def packed_positions(count: int, logits: torch.Tensor | None):
    """Inside this block, a split pass over one packed row of `count` positions, every one live, makes the
    vocabulary projection's logits at the positions `logits` alone (None: at every position)."""
    if logits is None:
        yield
        return
    token = _LIVE.set(LivePositions((1, count), None, logits))
    try:
        yield
    finally:
        _LIVE.reset(token)


def only_live(x: torch.Tensor, features: int, multiply, pack: bool = False) -> torch.Tensor:
    """`multiply` (rows, in) -> (rows, features) applied to x (..., in). Inside `live_positions`, for an x
    laid out as the pass's positions, only the live rows are multiplied. The others are zeros (finite: they
    flow on through the layers, whose results at live positions never read them), or, with `pack` (the
    vocabulary projection, the last layer), left out: the result is (1, positions read, features), the
    logits of the live positions (of a row's last alone where `live_positions` was asked so) in row order,
    so that no logits are ever made for padding or for positions no one reads (`packed_logits` reads them).
    A row's bits are the same either way: every multiply computes a row as in its tile, whatever the others
    (`tiled_linear`, adafuse/backend/cpu/projection.py)."""
    live = _LIVE.get()
    flat = x.reshape(-1, x.shape[-1])
    if live is None or tuple(x.shape[:-1]) != live.shape:
        return multiply(flat).reshape(*x.shape[:-1], features)
    if pack:
        return multiply(flat.index_select(0, live.logits)).unsqueeze(0)
    if live.index is None:
        return multiply(flat).reshape(*x.shape[:-1], features)
    computed = multiply(flat.index_select(0, live.index))
    out = flat.new_zeros(flat.shape[0], features)
    out.index_copy_(0, live.index, computed)
    return out.reshape(*x.shape[:-1], features)


def packed_logits(logits: torch.Tensor, lengths: list[int], width: int, last: list[bool] | None = None) -> torch.Tensor:
    """The logits of a pass run in `live_positions(lengths, width, last)`, as (positions read, vocab) in row
    order: as the packed head gave them (1, read, vocab), or taken from a head that gave every position
    (rows, width, vocab): a pass with no padding, or a head that `tile_linear_layers` could not wrap."""
    last = last or [False] * len(lengths)
    if logits.shape[:2] == (len(lengths), width):
        if all(length == width for length in lengths) and not any(last):
            return logits.reshape(-1, logits.shape[-1])
        return torch.cat(
            [logits[row, length - 1 if one else 0 : length] for row, (length, one) in enumerate(zip(lengths, last))]
        )
    read = sum(1 if one else length for length, one in zip(lengths, last))
    if logits.shape[:2] != (1, read):
        raise AssertionError(f"logits of shape {tuple(logits.shape)} for rows of {lengths} real positions")
    return logits[0]
