"""The vocabulary projection on the CPU, multiplied one block of the weight's rows at a time.

A model's last layer multiplies each position's hidden state by its output embeddings: 262,144 x 640
floats (671 MB) for Gemma-3. With a few rows of hidden states, MKL's GEMM reads that whole matrix from
memory again for every row or two. A block of 512 of its rows stays in the processor's cache while every
row is multiplied by it, so the matrix is read once. Each block is the same multiply over the same inner
dimension, so every logit keeps the bits of one multiply over the whole matrix with the same rows
(tests/engine/test_projection.py checks it on both bundled models' heads); only the time changes
(docs/speed.md, "The vocabulary projection on the CPU").

Each block is multiplied in row tiles like every other linear layer (adafuse/backend/cpu/tiles.py): the rows are
padded to whole tiles once, and every block's multiply is probed as its own kernel. A blocked head is blocked
for every number of rows, one included, so that a row's logits never depend on how many rows its pass had
(blocks of a different shape would be another kernel). Blocks go in runs of HELPER_CHECK, each run one batched
multiply (`block_products`) where a probe shows that it gives every block the bits of its own multiply: a loop
over blocks in Python took and dropped Python's lock at every block, and the other model's pass, on a thread
beside it, waited for it each time.

MKL does not divide a multiply of a few rows between threads, so with a core to spare (a model decoding
alone, or the other model's pass of the step over: adafuse/backend/cpu/cores.py) a kept thread takes blocks
too, each thread on one MKL thread, where a probe shows that one thread gives a block its bits. Which thread
multiplies a block never changes its bits.

Heads where blocks cost more than they save keep one multiply (docs/speed.md, the projection's figures): bfloat16
ones, whose CPU kernels were slower in blocks at every size measured, Gemma-3's real head included; and
heads with a narrow inner dimension (under `MIN_HIDDEN`: the tests' tiny models), where each block is
too little work to pay for its call. The CPU backend alone blocks a head (adafuse/backend/cpu/__init__.py).
"""

import itertools

import torch
import torch.nn.functional as F

from adafuse.backend.cpu.cores import Cores
from adafuse.backend.cpu.tiles import (
    KernelProbes,
    cpu_pass,
    fewer_threads_keep_bits,
    kernel_key,
    linear,
    linear_threads,
    multiply_in_tiles,
    one_call_is_tiled,
    pad_to_tiles,
    probe_input,
)
from adafuse.backend.install import swap
from adafuse.backend.live import only_live

BLOCK_ROWS = 512
MIN_HIDDEN = 256
HELPER_CHECK = 16  # blocks in a run: one call each, and a look for a free core between runs


class BlockedHead(torch.nn.Linear):
    """The vocabulary projection multiplied one block of rows at a time (module docstring), each block in row
    tiles; logits only where the pass reads them (adafuse/backend/live.py). In a pass whose forward context
    turns tiles off, one stock multiply. `kernels`: its backend's probes (set where it was blocked)."""

    kernels: KernelProbes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        settings = cpu_pass()
        if not settings.tiles:
            return only_live(x, self.out_features, lambda flat: F.linear(flat, self.weight, self.bias), pack=True)
        blocked = lambda flat: _blocked_rows(self, self.kernels, flat, settings.share)  # noqa: E731
        return only_live(x, self.out_features, blocked, pack=True)


def block_output_projection(model, probes: KernelProbes) -> bool:
    """Make the model's output embeddings a `BlockedHead` that reads `probes` where blocks pay (module docstring);
    idempotent. Whether its head is blocked now."""
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear and head.weight.device.type == "cpu":
        if head.weight.dtype == torch.float32 and head.in_features >= MIN_HIDDEN:
            swap(model, head, BlockedHead)
            head.kernels = probes
    return isinstance(head, BlockedHead)


def _blocked_rows(head: torch.nn.Linear, probes: KernelProbes, flat: torch.Tensor, share) -> torch.Tensor:
    rows, (blocks, stacked, runs) = flat.shape[0], _blocks(head)
    cores = probes.cores
    # block shape -> the rows padded to its tiles, whether one call keeps their bits, and whether one MKL
    # thread does: every block of a shape is one kernel (all but perhaps the last block share one), probed
    # once, not once per block
    padded: dict[torch.Size, tuple[torch.Tensor, bool, bool]] = {}
    for w, b in blocks:
        if w.shape not in padded:
            x = pad_to_tiles(probes, flat, w, b)
            whole = one_call_is_tiled(probes, w, b, x.shape[0])
            one_thread = cores.can_share and whole and fewer_threads_keep_bits(probes, w, b, x.shape[0], 1)
            padded[w.shape] = x, whole, one_thread
    on_free_cores = all(one_thread for _, _, one_thread in padded.values())
    out = flat.new_empty(rows, head.weight.shape[0])
    # each batched run's products, (blocks, padded rows, BLOCK_ROWS), moved into `out` once every run has ended:
    # a transposing copy per run, while a kept thread multiplied beside it, ran its OpenMP threads on cores
    # both threads held
    products: dict[int, torch.Tensor] = {}  # first block -> its run's products

    def multiply(run: range) -> None:
        """The blocks of `run` (one shape): in one call where that keeps each block's bits (`block_products`),
        else one by one into their columns of `out`."""
        w, b = blocks[run.start]
        x, whole, _ = padded[w.shape]
        threads = 1 if on_free_cores else linear_threads(probes, w, b, x.shape[0], share)
        batched = whole and stacked is not None and run.stop <= len(stacked)
        if batched and batched_blocks_keep_bits(probes, stacked, x.shape[0], threads):
            with cores.mkl_threads(threads):
                products[run.start] = block_products(x, stacked[run.start : run.stop])
            return
        for i in run:
            block = (linear if whole else multiply_in_tiles)(probes, x, *blocks[i], share)
            out[:, i * BLOCK_ROWS : i * BLOCK_ROWS + w.shape[0]] = block[:rows]

    if on_free_cores:
        _multiply_on_free_cores(cores, share, runs, multiply)
    else:
        for run in runs:
            multiply(run)
    for first, product in products.items():
        columns = out[:, first * BLOCK_ROWS : (first + len(product)) * BLOCK_ROWS].view(rows, len(product), BLOCK_ROWS)
        columns.copy_(product[:, :rows].transpose(0, 1))
    return out


def _runs(blocks: list[tuple[torch.Tensor, torch.Tensor | None]]) -> list[range]:
    """The blocks in runs of at most HELPER_CHECK, each of one shape."""
    runs: list[range] = []
    for i, (w, _) in enumerate(blocks):
        last = runs[-1] if runs else None
        if last is None or len(last) == HELPER_CHECK or blocks[last.start][0].shape != w.shape:
            runs.append(range(i, i + 1))
        else:
            runs[-1] = range(last.start, i + 1)
    return runs


def _multiply_on_free_cores(cores: Cores, share, runs: list[range], multiply) -> None:
    """multiply(run) for each run, each once, in any order: on the calling thread, joined by a kept thread
    while the caller has a core to spare (its own share of the cores and a free one: when a model runs alone,
    or the other model of its turn has ended), each on one MKL thread. Runs are taken one at a time, so a
    helper that joins late takes only what is left; one that never got to start is not waited for."""
    taken = itertools.count()  # next() on it is atomic under the GIL: each run is taken once
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def take() -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad), cores.mkl_threads(1):
            for i in iter(lambda: next(taken), None):
                if i >= len(runs):
                    return
                multiply(runs[i])

    helper = None
    with cores.mkl_threads(1):
        for i in iter(lambda: next(taken), None):
            if i >= len(runs):
                break
            if helper is None and cores.free_cores(share) > 1:
                helper = cores.kept_threads("projection", 1).submit(take)
            multiply(runs[i])
    if helper is not None and not helper.cancel():
        helper.result()


def _blocks(head: BlockedHead) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None]], torch.Tensor | None, list]:
    """The head's row blocks (views of its weight and bias), its full blocks as one (blocks, BLOCK_ROWS, in)
    view for `block_products` (None with a bias, or a weight whose rows cannot be viewed so), and the runs
    they are multiplied in (`_runs`), made once for the weight it holds now, not at every pass. Kept by the
    backend's probes (head -> (weight, bias, blocks, stacked, runs)), not on the module, so that a deep copy of a
    model (tests/support/members.py `narrow_window`) makes its own blocks instead of copying views, which deepcopy
    refuses."""
    weight, bias = head.weight, head.bias
    kept = head.kernels.blocks.get(head)
    if kept is None or kept[0] is not weight or kept[1] is not bias:
        blocks = [
            (weight[i : i + BLOCK_ROWS], None if bias is None else bias[i : i + BLOCK_ROWS])
            for i in range(0, weight.shape[0], BLOCK_ROWS)
        ]
        full = weight.shape[0] // BLOCK_ROWS
        stackable = bias is None and full > 0 and weight.is_contiguous()
        stacked = weight[: full * BLOCK_ROWS].view(full, BLOCK_ROWS, weight.shape[1]) if stackable else None
        kept = head.kernels.blocks[head] = (weight, bias, blocks, stacked, _runs(blocks))
    return kept[2], kept[3], kept[4]


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
            x = probe_input(rows, blocks[0], seed=rows)
            batched = block_products(x, blocks[:3])
            return all(torch.equal(batched[i], F.linear(x, blocks[i])) for i in range(batched.shape[0]))

    return probes.batched_blocks.get_or_probe((kernel_key(blocks[0], None), rows, threads), probe)
