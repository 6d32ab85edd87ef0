"""Batch size never changes an output: a merged pass computes every request exactly as it would be computed alone
(adafuse/backend/cpu/tiles.py, adafuse/backend/split_pass.py), bit for bit, in bfloat16 (the dtype the paper's configs
load) and float32, on the paper's pair in shape, with one multiply per linear layer whatever the number of requests
(row tiles); and `single` at batch size 8 equals batch size 1 and transformers' own generate()."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from adafuse import Ensemble, Request, SingleConfig
from adafuse.backend.cpu.tiles import kernel_key, probe_input, tile_rows
from adafuse.config import ModelConfig
from adafuse.engine.executor import Executor
from adafuse.engine.loop import decode_many, drive
from adafuse.member.cache import view_cache
from adafuse.methods import METHODS
from oracles.greedy import hf_greedy
from tests.support.members import pass_alone, pass_merged
from tests.support.paper_pair import NAMES

pytestmark = pytest.mark.slow

PROMPTS = [
    "Question: who wrote hamlet\nAnswer:",
    "Write one sentence about a cat.\nSentence: ",
    "List three colors:\n",
    "1, 2, 3, 4,",
    "Straße, Größe, Übermut und",
    "I love pizza 🍕 because",
    "[INST] What is 2+2? [/INST]",
    "The tokens </s> and <|eot_id|> are, in the middle of a longer prompt than the others,",
]


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def pair(request, paper_pair_dir):
    members = [ModelConfig(name=n, path=str(paper_pair_dir / n), dtype=request.param) for n in NAMES]
    return Ensemble.from_config(members)


def started(member, prompts: list[str]):
    clones = []
    for prompt in prompts:
        clone = member.clone()
        drive(clone.start(prompt))
        clones.append(clone)
    return clones


def test_a_merged_pass_computes_every_request_as_alone_bit_for_bit(pair):
    for member in pair.members:
        assert member.runner.prepared.splits_attention
        # Greedy steps (one row, one token, caches of different lengths) and forks (rows of several tokens).
        steps = started(member, PROMPTS)
        step_inputs = [torch.tensor([[c.logprobs.argmax().item()]], device=member.device) for c in steps]
        forks = [c.fork(3) for c in started(member, PROMPTS[:4])]
        three, one = [[5, 6, 7], [8, 9, 10], [11, 12, 13]], [[14], [15], [16]]
        fork_inputs = [torch.tensor(rows, device=member.device) for rows in (three, one, three, one)]
        for caches, inputs in [([c.cache for c in steps], step_inputs), ([f.cache for f in forks], fork_inputs)]:
            alone = [pass_alone(member, view_cache(c), x) for c, x in zip(caches, inputs)]
            merged = pass_merged(member, [view_cache(c) for c in caches], inputs)
            assert all(torch.equal(a, m) for a, m in zip(alone, merged))


@pytest.mark.parametrize("index", [0, 1], ids=["smollm2", "gemma3"])
def test_what_exactness_fixes_the_stock_kernels_round_a_request_by_the_rows_beside_it(tiny, index):
    """On the bundled models' real weights, a merged pass with the stock kernels (`exact=False`) gives greedy
    steps other bits than their passes alone with the same kernels: a multiply's kernel is picked by its rows."""
    member = tiny.members[index]
    steps = started(member, PROMPTS[:3])
    inputs = [torch.tensor([[c.logprobs.argmax().item()]], device=member.device) for c in steps]
    alone = [pass_alone(member, view_cache(c.cache), x, exact=False) for c, x in zip(steps, inputs)]
    loose = pass_merged(member, [view_cache(c.cache) for c in steps], inputs, exact=False)
    assert not all(torch.equal(a, m) for a, m in zip(alone, loose))


def test_a_prompt_tail_read_in_a_merged_pass_gets_the_logits_and_cache_of_its_read_alone(pair):
    """A step's last prompt shares the merged pass (adafuse/engine/scheduler.py `plan_step`): its tail, read after a
    stored prefix for the last position's logits alone, beside other examples' steps, is bit for bit its
    read alone, logits and cache, and the steps are their passes alone."""
    for member in pair.members:
        steps = started(member, PROMPTS[:3])
        step_inputs = [torch.tensor([[c.logprobs.argmax().item()]], device=member.device) for c in steps]
        (prefix,) = started(member, PROMPTS[7:])
        ids = prefix.ids + member.tokenisation.encode_text(" and then some more words, read as a prompt's tail")
        keep = len(prefix.ids) - 3
        tail = torch.tensor([ids[keep:]], device=member.device)
        alone_cache, merged_cache = (view_cache(prefix.cache, keep) for _ in range(2))
        alone = pass_alone(member, alone_cache, tail, last_only=True)
        caches = [c.cache for c in steps]
        merged = pass_merged(
            member,
            [merged_cache] + [view_cache(c) for c in caches],
            [tail] + step_inputs,
            last_only=[True, False, False, False],
        )
        assert merged[0].shape == alone.shape == (1, 1, member.runner.vocab_size) and torch.equal(merged[0], alone)
        for a, m in zip(alone_cache.layers, merged_cache.layers, strict=True):
            assert a.keys.shape[2] == len(ids) and torch.equal(a.keys, m.keys) and torch.equal(a.values, m.values)
        for cache, x, logits in zip(caches, step_inputs, merged[1:]):
            assert torch.equal(pass_alone(member, view_cache(cache), x), logits)


def test_rows_of_unequal_length_in_a_merged_pass_get_the_logits_and_cache_of_their_pass_alone(pair):
    """Forks whose rows read unequal numbers of ids (branches that ended, candidates of unequal length, a row
    that reads nothing) beside greedy steps: the split pass packs only their real positions, and every
    request gets the logits and the cache of its pass alone (where the linear layers leave its padding at
    zeros), bit for bit."""
    for member in pair.members:
        steps = started(member, PROMPTS[4:7])
        step_inputs = [torch.tensor([[c.logprobs.argmax().item()]], device=member.device) for c in steps]
        forks = [c.fork(3) for c in started(member, PROMPTS[:3])]
        fork_inputs = [torch.tensor(rows, device=member.device) for rows in ([[5, 6, 7]] * 3, [[8, 9]] * 3, [[4]] * 3)]
        real = [[3, 1, 2], [0, 2, 1], [1, 0, 1]] + [None] * len(steps)
        caches = [f.cache for f in forks] + [c.cache for c in steps]
        inputs = fork_inputs + step_inputs
        alone_caches, merged_caches = [view_cache(c) for c in caches], [view_cache(c) for c in caches]
        alone = [pass_alone(member, c, x, lengths=n) for c, x, n in zip(alone_caches, inputs, real)]
        merged = pass_merged(member, merged_caches, inputs, lengths=real)
        assert [m.shape for m in merged[:3]] == [
            (6, member.runner.vocab_size),
            (3, member.runner.vocab_size),
            (2, member.runner.vocab_size),
        ]
        assert all(torch.equal(a, m) for a, m in zip(alone, merged, strict=True)), member.name
        for a_cache, m_cache in zip(alone_caches, merged_caches):
            for a, m in zip(a_cache.layers, m_cache.layers, strict=True):
                assert torch.equal(a.keys, m.keys) and torch.equal(a.values, m.values), member.name


@pytest.mark.parametrize("which", [0, 1], ids=NAMES)
def test_single_at_batch_8_equals_batch_1_and_generate(pair, which):
    spec, cfg = METHODS["single"], SingleConfig(which)

    def one(members, i):
        return spec.generate(members, Request(PROMPTS[i], max_new_tokens=16, trace=True), cfg)

    alone = [drive(one(pair.members, i)) for i in range(len(PROMPTS))]
    executor = Executor(exact=True)
    batched = dict(decode_many(pair.members, range(len(PROMPTS)), one, 8, executor))
    assert executor.merged > 0
    member = pair.members[which]
    stock = member.model.config._attn_implementation
    member.model.set_attn_implementation("sdpa")  # transformers' own attention, not the batching wrapper
    try:
        for i, prompt in enumerate(PROMPTS):
            assert batched[i].ids == alone[i].ids and batched[i].text == alone[i].text, prompt
            assert [s.logprob for s in batched[i].trace.steps] == [s.logprob for s in alone[i].trace.steps]
            assert alone[i].ids[0] == hf_greedy(member, prompt, 16), prompt
    finally:
        member.model.set_attn_implementation(stock)


SHARED = "Answer.\n\nQuestion: who wrote hamlet\nAnswer: Shakespeare\n\nQuestion: where is rome\nAnswer: Italy\n\n"
ASKED = ["who wrote the odyssey", "who wrote faust", "who painted the night watch", "where is lima", "who wrote it"]


@pytest.mark.parametrize("which", [0, 1], ids=NAMES)
def test_a_prompts_numbers_never_depend_on_the_prompts_read_before_it(pair, which):
    """Prompts that share a declared prefix, and some of them more (questions that start alike), decoded at
    batch size 1 in order, in reverse order and at batch size 8: every step's log-probability is the same,
    bit for bit. Where a prompt is split depends on the prompt alone (`Member.prefix_length`), not on how
    much of it the prompts read before it happen to share."""
    spec, cfg = METHODS["single"], SingleConfig(which)
    requests = [Request(f"{SHARED}Question: {q}\nAnswer:", max_new_tokens=6, trace=True, prefix=SHARED) for q in ASKED]

    def one(members, i):
        return spec.generate(members, requests[i], cfg)

    forward = [drive(one(pair.members, i)) for i in range(len(requests))]
    backward = [drive(one(pair.members, i)) for i in reversed(range(len(requests)))][::-1]
    batched = dict(decode_many(pair.members, range(len(requests)), one, 8, Executor(exact=True)))
    for i in range(len(requests)):
        runs = [forward[i], backward[i], batched[i]]
        assert [s.logprob for s in runs[0].trace.steps] == [s.logprob for s in runs[1].trace.steps], ASKED[i]
        assert [s.logprob for s in runs[0].trace.steps] == [s.logprob for s in runs[2].trace.steps], ASKED[i]
        assert runs[0].ids == runs[1].ids == runs[2].ids
    shared, member = pair.members[which].tokenisation.encode(SHARED), pair.members[which]
    # the prefix was read on its own and kept (its last token may go with the question instead)
    assert any(len(ids) >= len(shared) - 1 and shared[: len(ids)] == ids for ids, _ in member.runner.prompts.entries)


class MultiplyCount(TorchFunctionMode):
    """Counts the matrix multiplies (F.linear calls) made inside the block."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func is F.linear
        return func(*args, **(kwargs or {}))


def mixed_requests(member, count: int) -> tuple[list, list]:
    """`count` requests over caches of different lengths, 1-3 rows of 1-4 tokens each, in a fixed mix."""
    starts = started(member, PROMPTS)
    caches, inputs = [], []
    for j in range(count):
        rows, width = 1 + j % 3, 1 + (j * 7) % 4
        base = starts[j % len(PROMPTS)]
        caches.append(base.fork(rows).cache if rows > 1 else base.cache)
        ids = [[(11 * j + 5 * r + c) % 500 + 3 for c in range(width)] for r in range(rows)]
        inputs.append(torch.tensor(ids, device=member.device))
    return caches, inputs


def test_a_row_s_logits_do_not_depend_on_what_shares_its_pass_and_it_is_one_multiply(pair):
    """1 to 64 requests of mixed widths, row counts and cache lengths, in one order and the reverse: every
    request's logits are those of its pass alone, bit for bit, and a merged pass makes as many multiplies
    as a pass alone (the linear layers multiply all its rows at once, in row tiles)."""
    for member in pair.members:
        caches, inputs = mixed_requests(member, 64)
        alone = [pass_alone(member, view_cache(c), x) for c, x in zip(caches, inputs)]
        for count in (1, 2, 5, 17, 64):
            for order in (range(count), reversed(range(count))):
                order = list(order)
                merged = pass_merged(member, [view_cache(caches[j]) for j in order], [inputs[j] for j in order])
                assert all(torch.equal(m, alone[j]) for j, m in zip(order, merged)), (member.name, count)
        with MultiplyCount() as one:
            pass_alone(member, view_cache(caches[0]), inputs[0])
        with MultiplyCount() as sixty_four:  # its row counts were met (and probed) above
            pass_merged(member, [view_cache(c) for c in caches], inputs)
        linear_layers = sum(isinstance(m, torch.nn.Linear) for m in member.model.modules())
        assert one.calls == linear_layers, member.name
        if member.model.dtype == torch.float32:  # the CPU's default: one multiply of all the rows per layer
            assert sixty_four.calls == linear_layers, member.name
        # in bfloat16 some layers of this pair go tile by tile above some row count (one multiply of
        # all the rows is probed and found to round differently): exact still, not one multiply


@pytest.mark.parametrize("index", [0, 1], ids=["smollm2", "gemma3"])
def test_every_linear_layer_of_the_bundled_models_gives_a_row_its_bits_whatever_its_pass(tiny, index):
    """On both bundled models' real weights (float32): a row placed first, last or in the middle of a pass
    of 1 to 64 rows, beside random others, gets the bits it gets alone, through each of the model's layer
    shapes (the blocked vocabulary projection included)."""
    model = tiny.members[index].model
    layers = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            layers.setdefault((module.in_features, module.out_features), module)
    generator = torch.Generator().manual_seed(index)
    for (hidden, _), layer in layers.items():
        row = torch.randn(1, hidden, generator=generator)
        alone = layer(row)[0]
        head = layer is model.get_output_embeddings()
        for rows in (1, 2, 3, 5, 8, 13, 34, 64) if head else range(1, 65):
            others = torch.randn(rows - 1, hidden, generator=generator)
            for place in sorted({0, rows // 2, rows - 1}):
                shared = torch.cat([others[:place], row, others[place:]])
                assert torch.equal(layer(shared)[place], alone), (layer, rows, place)


def test_the_tile_by_tile_path_gives_each_tile_s_bits(smol):
    """Where one multiply of all the rows would not keep each tile's bits, tiles are multiplied one by one: one
    multiply per tile, each tile's rows the bits of that tile multiplied alone, and the one multiply's bits wherever
    this CPU's probe found the two to agree. (Whether they agree is the host BLAS's to say; the rest is not.)"""
    layer = next(m for m in smol.model.modules() if isinstance(m, torch.nn.Linear))
    probes = smol.runner.backend.probes
    x = torch.randn(3, 7, layer.in_features, generator=torch.Generator().manual_seed(5))
    tile = tile_rows(probes, layer.weight, layer.bias)
    padded = -(-21 // tile) * tile
    with torch.inference_mode():
        one_call = layer(x)
        rows = torch.cat([x.reshape(21, -1), x.new_zeros(padded - 21, x.shape[-1])])
        each_tile = torch.cat([layer(part) for part in rows.split(tile)])[:21]  # a tile alone: one multiply
    key = (kernel_key(layer.weight, layer.bias), padded)
    one_call_is_tiled = probes.one_call[key]
    probes.one_call[key] = False
    probes.layouts.clear()  # the layer's layout for 21 rows holds the verdict: laid out again from the new one
    try:
        with MultiplyCount() as count, torch.inference_mode():
            by_tiles = layer(x)
    finally:
        probes.one_call[key] = one_call_is_tiled
        probes.layouts.clear()
    assert count.calls == padded // tile
    assert torch.equal(by_tiles.reshape(21, -1), each_tile)
    assert torch.equal(by_tiles, one_call) or not one_call_is_tiled


@pytest.mark.parametrize("index", [0, 1], ids=["smollm2", "gemma3"])
def test_the_probe_rows_tell_apart_two_orders_of_summing_the_inner_dimension(tiny, index):
    """The rows that decide a kernel's tiles (`probe_input`) show a change in summation order through
    bfloat16's 8 bits, which hide it in nearly every output of plain random rows: the sum of the inner
    dimension (in float64: one order, whatever blocking the processor's float32 kernel uses; on one core an
    AVX-512 float32 kernel may itself sum in two halves) against two halves summed apart in float32 (what
    another kernel's blocking does), rounded."""
    layer = next(m for m in tiny.members[index].model.modules() if isinstance(m, torch.nn.Linear))
    weight = layer.weight.detach().to(torch.bfloat16).float()
    half = weight.shape[1] // 2

    def outputs_apart(x: torch.Tensor) -> int:
        x = x.to(torch.bfloat16).float()
        whole = (x.double() @ weight.double().T).to(torch.bfloat16)
        halves = (x[:, :half] @ weight[:, :half].T + x[:, half:] @ weight[:, half:].T).to(torch.bfloat16)
        return int((whole != halves).sum())

    probe = outputs_apart(probe_input(64, weight.to(torch.bfloat16), seed=0))
    plain = outputs_apart(torch.randn(64, weight.shape[1], generator=torch.Generator().manual_seed(0)))
    assert probe >= 20 and probe > 4 * plain, (probe, plain)
