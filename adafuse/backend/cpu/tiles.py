"""Linear layers in row tiles: a row's bits never depend on the other rows of its multiply.

A matrix multiply's kernel, and so its summation order, is picked by the number of rows (MKL's float32 GEMM
on this CPU: 1, 2-3 and 4 or more rows, and with 2 threads a split of 5-7 and 9-11 rows), so a row multiplied
together with others may differ in its last bits from the same row alone. So every linear layer of a member's
model (`TiledLinear`, installed by `tile_linear_layers`) multiplies its rows in fixed row tiles: the rows are
zero-padded to a whole number of tiles of `tile_rows` rows, so a row's bits are those of its tile, whoever
shares the tile and wherever the row sits in it. Where one multiply of all the padded rows gives every tile's
bits (probed once per kernel and row count: `one_call_is_tiled`), the rows are multiplied in one call, which
is what a merged pass costs without exactness; otherwise tile by tile. The tile size is probed once per
device, dtype, weight shape and thread count (`tile_rows`); on this CPU it is 4 rows in float32 and 1 or 2 in
bfloat16.

The tiles change the canonical computation itself: a pass of one row is multiplied as a tile of `tile_rows`
rows (one real, the rest zeros), in every pass of a member, alone or merged, and in `generate()` over the
member's model too (outside the engine's passes the forward context keeps tiles on: adafuse/backend/forward.py).
A pass whose context turns tiles off multiplies with the stock kernel, one call over its rows.

Every probe's verdict lives in the `KernelProbes` of the backend that prepared the model, backed by a probe store on
disk for the environment (adafuse/backend/probe_store.py); each tiled layer holds its backend's probes from install
on. How a pass multiplies (in tiles or not, on which share of the cores) is the CPU backend's part of the pass's
forward context (`CpuPass`).
"""

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from adafuse.backend.forward import current
from adafuse.backend.install import swap
from adafuse.backend.live import only_live
from adafuse.backend.probe_store import ProbeStore, Verdicts

TILE_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)  # row tiles tried, fewest first
PROBE_ROWS = 64  # the one multiply a tile size must agree with (a multiple of every candidate)
_MKL_DTYPES = (torch.float32, torch.float64)  # the CPU multiplies MKL runs (bfloat16 runs in oneDNN)


class KernelProbes:
    """The verdicts of the multiply probes, one table each, backed by a probe store, and the CPU's cores, whose
    MKL threads a multiply may share (adafuse/backend/cpu/cores.py; None off the CPU). One per backend; every
    layer it tiles holds it (a deep copy of a model shares it: it is the backend's, not the layer's)."""

    def __init__(self, store: ProbeStore, cores=None):
        self.tile_rows = Verdicts("tile_rows", store)  # kernel key -> the rows of its tile
        self.one_call = Verdicts("one_call", store)  # (kernel key, padded rows) -> does one call give each tile's bits?
        self.fewer_threads = Verdicts("fewer_threads", store)  # (kernel key, rows, MKL threads) -> all threads' bits?
        self.batched_blocks = Verdicts("batched_blocks", store)  # (block kernel key, rows, MKL threads) -> blockwise?
        self.cores = cores
        # (id(weight), rows, torch threads, MKL threads of the share) -> (weakref to the weight, its layout):
        # a pass asks every layer's, and looking the verdicts up again costs more than a small multiply
        self.layouts: dict[tuple, tuple] = {}
        # blocked head -> its row blocks (adafuse/backend/cpu/projection.py), made once for the weight it holds
        self.blocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __deepcopy__(self, memo) -> "KernelProbes":
        return self


@dataclass(frozen=True)
class CpuPass:
    """The CPU backend's part of a pass's forward context (adafuse/backend/forward.py): whether its linear layers
    multiply in row tiles (False: the stock kernels, one call), and the threads this thread shares the cores with
    (adafuse/backend/cpu/cores.py `CoreShare`; None: all of them)."""

    tiles: bool = True
    share: Any = None


OUTSIDE_A_PASS = CpuPass()  # outside any pass: tiles on, as in every pass alone


def cpu_pass() -> CpuPass:
    """The running pass's CPU settings (OUTSIDE_A_PASS outside any pass)."""
    own = current().own
    return own if isinstance(own, CpuPass) else OUTSIDE_A_PASS


class TiledLinear(torch.nn.Linear):
    """A linear layer that multiplies in row tiles (module docstring), or with the stock kernel in a pass whose
    forward context turns tiles off. Only the live positions are multiplied (adafuse/backend/live.py). `kernels`:
    its backend's probes (set where it was tiled)."""

    head = False  # the vocabulary projection: logits only where the pass reads them (`only_live`'s `pack`)
    kernels: KernelProbes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        settings = cpu_pass()
        if not settings.tiles:
            return only_live(x, self.out_features, lambda flat: F.linear(flat, self.weight, self.bias), self.head)
        return only_live(
            x, self.out_features, lambda flat: tiled_rows(self.kernels, self, flat, settings.share), self.head
        )


class TiledHead(TiledLinear):
    head = True


def tile_linear_layers(model, probes: KernelProbes) -> None:
    """Make every linear layer of the model a `TiledLinear` (the output embeddings a `TiledHead`) that reads
    `probes`, unless the backend already made it another kind of its own (the CPU's blocked head). Idempotent. A
    model whose weights are not materialised (the meta device) is left alone: nothing to probe."""
    head = model.get_output_embeddings()
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.device.type != "meta":
            swap(model, module, TiledHead if module is head else TiledLinear)
            module.kernels = probes


def tiled_rows(probes: KernelProbes, module: torch.nn.Linear, flat: torch.Tensor, share) -> torch.Tensor:
    """`module`'s multiply of `flat` (rows, in) in row tiles, laid out for this row count (tile, padded rows, one
    call or tile by tile, MKL threads) as `probes.layouts` keeps it: the verdicts `multiply_in_tiles` reads."""
    weight, bias = module.weight, module.bias
    share_threads = probes.cores.blas_threads(share) if probes.cores is not None else None
    key = (id(weight), flat.shape[0], torch.get_num_threads(), share_threads)
    kept = probes.layouts.get(key)
    if kept is None or kept[0]() is not weight:
        tile = tile_rows(probes, weight, bias)
        padded = -(-flat.shape[0] // tile) * tile
        whole = one_call_is_tiled(probes, weight, bias, padded)
        threads = linear_threads(probes, weight, bias, padded if whole else tile, share)
        kept = probes.layouts[key] = (weakref.ref(weight), (tile, padded, whole, threads))
    tile, padded, whole, threads = kept[1]
    rows = flat.shape[0]
    x = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])]) if padded > rows else flat
    with probes.cores.mkl_threads(threads) if threads is not None else contextlib.nullcontext():
        if whole:
            return F.linear(x, weight, bias)[:rows]
        return torch.cat([F.linear(part, weight, bias) for part in x.split(tile)])[:rows]


def pad_to_tiles(probes: KernelProbes, flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """The rows (rows, in) followed by zero rows up to a whole number of this multiply's tiles."""
    tile = tile_rows(probes, weight, bias)
    missing = -flat.shape[0] % tile
    return torch.cat([flat, flat.new_zeros(missing, flat.shape[1])]) if missing else flat


def multiply_in_tiles(
    probes: KernelProbes, padded: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, share=None
) -> torch.Tensor:
    """Rows already padded to whole tiles (`pad_to_tiles`): one call where it keeps each tile's bits,
    else tile by tile. (Calls of PROBE_ROWS rows, each probed, were tried for the second case: on the
    paper pair in shape in bfloat16 one request of 64 still came out a bfloat16 step apart, so a probe
    of a part of a larger pass is not trusted.)"""
    if one_call_is_tiled(probes, weight, bias, padded.shape[0]):
        return linear(probes, padded, weight, bias, share)
    tile = tile_rows(probes, weight, bias)
    return torch.cat([linear(probes, part, weight, bias, share) for part in padded.split(tile)])


def linear(probes: KernelProbes, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, share=None):
    """F.linear(x, weight, bias) on the calling thread's share of the cores (`linear_threads`)."""
    threads = linear_threads(probes, weight, bias, x.shape[0], share)
    if threads is None:
        return F.linear(x, weight, bias)
    with probes.cores.mkl_threads(threads):
        return F.linear(x, weight, bias)


def linear_threads(probes: KernelProbes, weight: torch.Tensor, bias: torch.Tensor | None, rows: int, share=None):
    """The MKL threads a multiply of `rows` rows runs on: the calling thread's share of the cores
    (adafuse/backend/cpu/cores.py), where a probe shows that the fewer threads give the same bits
    (`fewer_threads_keep_bits`); else None, all of them."""
    if probes.cores is None or weight.device.type != "cpu" or weight.dtype not in _MKL_DTYPES:
        return None
    threads = probes.cores.blas_threads(share)
    if threads is not None and not fewer_threads_keep_bits(probes, weight, bias, rows, threads):
        return None
    return threads


def kernel_key(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """What picks a multiply's kernel, values aside: device, dtype, shape, layout and threads."""
    return (
        weight.device,
        weight.dtype,
        tuple(weight.shape),
        weight.stride(),
        bias is not None,
        torch.get_num_threads(),
    )


def tile_rows(probes: KernelProbes, weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """The rows of a tile for this kernel: the fewest (of TILE_CANDIDATES) such that a row gets the same
    bits at any place in a tile, beside any rows, as alone in a tile of zeros, and tile-by-tile bits
    equal one multiply of PROBE_ROWS rows (so that merged passes multiply in one call). Where no size
    agrees with the one multiply, the largest position-invariant one: passes then loop over tiles.
    Probed once per kernel key (device, dtype, shape, threads), not per model, and kept in the probe store."""

    def probe() -> int:
        with torch.inference_mode():
            x = probe_input(PROBE_ROWS, weight, seed=0)
            whole = F.linear(x, weight, bias)
            agreeing = (
                t
                for t in TILE_CANDIDATES
                if torch.equal(_tile_by_tile(x, weight, bias, t), whole) and _position_invariant(x, weight, bias, t)
            )
            steady = (t for t in reversed(TILE_CANDIDATES) if _position_invariant(x, weight, bias, t))
            return next(agreeing, None) or next(steady)

    return probes.tile_rows.get_or_probe(kernel_key(weight, bias), probe)


def one_call_is_tiled(probes: KernelProbes, weight: torch.Tensor, bias: torch.Tensor | None, padded_rows: int) -> bool:
    """Does one multiply of `padded_rows` rows give every row the bits of its tile? Probed once per kernel
    key and row count, on first use (or read from the probe store, where the same environment probed it):
    every row count a pass reaches is checked, none assumed."""
    tile = tile_rows(probes, weight, bias)
    if padded_rows <= tile:
        return True

    def probe() -> bool:
        with torch.inference_mode():
            x = probe_input(padded_rows, weight, seed=padded_rows)
            return torch.equal(F.linear(x, weight, bias), _tile_by_tile(x, weight, bias, tile))

    return probes.one_call.get_or_probe((kernel_key(weight, bias), padded_rows), probe)


def fewer_threads_keep_bits(
    probes: KernelProbes, weight: torch.Tensor, bias: torch.Tensor | None, rows: int, threads: int
) -> bool:
    """Does a multiply of `rows` rows on `threads` MKL threads give the bits it gets on all of them? Probed
    once per kernel key, row count and thread count, on first use (or read from the probe store)."""

    def probe() -> bool:
        with torch.inference_mode():
            x = probe_input(rows, weight, seed=rows)
            with probes.cores.mkl_threads(threads):
                fewer = F.linear(x, weight, bias)
            return torch.equal(fewer, F.linear(x, weight, bias))

    return probes.fewer_threads.get_or_probe((kernel_key(weight, bias), rows, threads), probe)


def probe_input(rows: int, weight: torch.Tensor, seed: int) -> torch.Tensor:
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
