"""Batch size never changes an output: a merged pass computes every request exactly as it would be
computed alone (adafuse/invariance.py), bit for bit, in bfloat16 (the dtype the paper's configs load)
and float32, on the paper's pair in shape; and `single` at batch size 8 equals batch size 1 and
transformers' own generate()."""

import pytest
import torch

from adafuse import Ensemble, Request, SingleConfig
from adafuse.batching import Scheduler, can_merge_exactly, decode_many, forward_together
from adafuse.config import ModelConfig
from adafuse.methods import METHODS
from oracles.greedy import hf_greedy
from tools.paper_pair import NAMES

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
        clone.start(prompt)
        clones.append(clone)
    return clones


def test_a_merged_pass_computes_every_request_as_alone_bit_for_bit(pair):
    loose_equal = []
    for member in pair.members:
        assert can_merge_exactly(member.model)
        # Greedy steps (one row, one token, caches of different lengths) and forks (rows of several tokens).
        steps = started(member, PROMPTS)
        step_inputs = [torch.tensor([[c.logprobs.argmax().item()]], device=member.device) for c in steps]
        forks = [c.fork(3) for c in started(member, PROMPTS[:4])]
        three, one = [[5, 6, 7], [8, 9, 10], [11, 12, 13]], [[14], [15], [16]]
        fork_inputs = [torch.tensor(rows, device=member.device) for rows in (three, one, three, one)]
        for caches, inputs in [([c.cache for c in steps], step_inputs), ([f.cache for f in forks], fork_inputs)]:
            alone = [member.forward_alone(_copy(c), x) for c, x in zip(caches, inputs)]
            merged, _ = forward_together(member, [_copy(c) for c in caches], inputs, exact=True)
            assert all(torch.equal(a, m) for a, m in zip(alone, merged))
            loose, _ = forward_together(member, [_copy(c) for c in caches], inputs, exact=False)
            loose_equal += [torch.equal(a, m) for a, m in zip(alone, loose)]
    assert not all(loose_equal)  # what exactness fixes: a padded merged pass rounds differently


def _copy(cache):
    """A cache of its own over the same tensors (a forward pass replaces its layers' tensors)."""
    from adafuse.model import _derive

    return _derive(cache, lambda t: t)


@pytest.mark.parametrize("which", [0, 1], ids=NAMES)
def test_single_at_batch_8_equals_batch_1_and_generate(pair, which):
    spec, cfg = METHODS["single"], SingleConfig(which)

    def one(members, i):
        return spec.generate(members, Request(PROMPTS[i], max_new_tokens=16, trace=True), cfg)

    alone = [one(pair.members, i) for i in range(len(PROMPTS))]
    scheduler = Scheduler(exact=True)
    batched = dict(decode_many(pair.members, range(len(PROMPTS)), one, 8, scheduler))
    assert scheduler.merged > 0
    member = pair.members[which]
    stock = member.model.config._attn_implementation
    member.model.set_attn_implementation("sdpa")  # transformers' own attention, not the batching wrapper
    try:
        for i, prompt in enumerate(PROMPTS):
            assert batched[i].ids == alone[i].ids and batched[i].text == alone[i].text, prompt
            # A prompt's tail is read after whatever prefix is cached (README: Batching); in float32 that
            # read can round differently from reading the whole prompt, well below any decision.
            tolerance = 0 if member.model.dtype == torch.bfloat16 else 1e-5
            assert [s.logprob for s in batched[i].trace.steps] == pytest.approx(
                [s.logprob for s in alone[i].trace.steps], abs=tolerance
            )
            assert alone[i].ids[0] == hf_greedy(member, prompt, 16), prompt
    finally:
        member.model.set_attn_implementation(stock)
