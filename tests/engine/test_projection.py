"""The blocked vocabulary projection (adafuse/backend/cpu/projection.py) on the bundled models' real heads: the same
bits as one F.linear over the whole matrix with the same (tile-padded) rows, for every number of rows a
decoder gives it, inside a merged pass too; and only where blocks pay: float32 heads of a wide hidden
size, on the CPU."""

import threading

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from adafuse.backend import backend_for
from adafuse.backend.cpu import projection
from adafuse.backend.cpu.projection import BLOCK_ROWS, MIN_HIDDEN, BlockedHead, block_output_projection
from adafuse.backend.cpu.tiles import pad_to_tiles
from adafuse.member.member import Member

PROBES = backend_for(torch.device("cpu")).probes


class BlockCount:
    """Counts the multiplies by one block of a weight of `vocab` rows, and by the whole of it, on every thread (a kept
    thread may take some of a multiply's blocks: adafuse/backend/cpu/projection.py), and the threads of the blocks.
    Blocks are multiplied in runs, one batched multiply each (`block_products`), or one F.linear each."""

    def __init__(self, vocab: int):
        self.vocab, self.blocks, self.whole, self.threads = vocab, 0, 0, set()
        self.per_multiply = -(-vocab // BLOCK_ROWS)  # the blocks of one blocked multiply
        self.lock = threading.Lock()

    def _saw(self, weights: list[torch.Tensor]) -> None:
        with self.lock:
            blocks = sum(w.shape[0] == BLOCK_ROWS for w in weights)
            self.blocks += blocks
            if blocks:
                self.threads.add(threading.get_ident())
            self.whole += sum(w.shape[0] == self.vocab for w in weights)

    def __enter__(self) -> "BlockCount":
        self.linear, self.products = F.linear, projection.block_products

        def counting(x, weight, bias=None):
            self._saw([weight])
            return self.linear(x, weight, bias)

        def counting_runs(x, blocks):
            self._saw(list(blocks))
            return self.products(x, blocks)

        F.linear, projection.block_products = counting, counting_runs
        return self

    def __exit__(self, *exc) -> None:
        F.linear, projection.block_products = self.linear, self.products


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1], ids=["smollm2", "gemma3"])
def test_the_blocked_projection_gives_the_bits_of_one_multiply(tiny, index):
    """For every number of rows, one included: the bits of one F.linear over the whole matrix with the
    same rows, padded to the blocks' row tiles (adafuse/backend/cpu/tiles.py), and blocks every time, shared
    with a kept thread where a core is free."""
    head = tiny.members[index].model.get_output_embeddings()
    vocab, hidden = head.weight.shape
    assert isinstance(head, BlockedHead)  # every Member blocks its model's head on the CPU
    generator = torch.Generator().manual_seed(index)
    threads = set()  # the threads that multiplied blocks
    for shape in [(1, 1), (1, 2), (3, 1), (1, 5), (2, 4), (1, 33), (4, 32), (1, 129)]:
        x = torch.randn(*shape, hidden, generator=generator)
        head(x)  # the first multiply of a row count probes its tiles (adafuse/backend/cpu/tiles.py)
        with BlockCount(vocab) as count:
            got = head(x)
        rows = shape[0] * shape[1]
        padded = pad_to_tiles(PROBES, x.reshape(rows, hidden), head.weight[:BLOCK_ROWS], None)
        assert torch.equal(got.reshape(rows, vocab), F.linear(padded, head.weight, head.bias)[:rows]), shape
        assert (count.blocks, count.whole) == (count.per_multiply, 0), shape
        threads |= count.threads
    if PROBES.cores.can_share and torch.get_num_threads() > 1:  # a core to spare: a kept thread took blocks
        assert len(threads) == 2


@pytest.mark.slow
def test_a_merged_pass_multiplies_all_its_rows_in_blocks_once(smol):
    """A merged pass's rows go through the blocked projection together, one multiply per block, and each
    request's rows get the bits they get alone."""
    head = smol.model.get_output_embeddings()
    x = torch.randn(2, 3, head.in_features, generator=torch.Generator().manual_seed(7))
    head(x)  # probes this row count's tiles
    with BlockCount(head.out_features) as count:
        merged = head(x)
    assert count.blocks == count.per_multiply and count.whole == 0
    assert torch.equal(merged[0], head(x[0]))
    assert torch.equal(merged[1, :2], head(x[1, :2]))


class HeadOnly(torch.nn.Module):
    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        self.lm_head = head

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head


@pytest.mark.parametrize(
    "dtype, hidden, blocked",
    [(torch.float32, 640, True), (torch.bfloat16, 640, False), (torch.float32, MIN_HIDDEN - 1, False)],
    ids=["float32", "bfloat16", "narrow"],
)
def test_only_wide_float32_heads_are_blocked(dtype, hidden, blocked):
    model = HeadOnly(torch.nn.Linear(hidden, 2 * BLOCK_ROWS + 3, bias=False, dtype=dtype))
    assert block_output_projection(model, PROBES) == blocked == isinstance(model.lm_head, BlockedHead)
    x = torch.randn(3, hidden, dtype=dtype, generator=torch.Generator().manual_seed(3))
    model.lm_head(x)  # the first multiply of a row count probes its tiles (adafuse/backend/cpu/tiles.py)
    with BlockCount(model.lm_head.out_features) as count:
        got = model.lm_head(x)
    assert (count.blocks, count.whole) == ((2, 0) if blocked else (0, 1))
    weight = model.lm_head.weight
    if not blocked:
        assert torch.equal(got, F.linear(x, weight))
        return
    # each block multiplies in its own shape's row tiles: the two full blocks alike, the last 3 rows apart
    full = 2 * BLOCK_ROWS
    for part in (slice(0, full), slice(full, None)):
        want = F.linear(pad_to_tiles(PROBES, x, weight[part][:BLOCK_ROWS], None), weight[part])[:3]
        assert torch.equal(got[:, part], want)


@pytest.mark.slow
def test_a_model_off_the_cpu_keeps_its_head(smol):
    config = AutoConfig.from_pretrained(smol.model.name_or_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert not block_output_projection(model, PROBES)
    Member("meta", smol.tokenisation.tokenizer, model)  # nor does a member of it
    assert type(model.get_output_embeddings()) is torch.nn.Linear
