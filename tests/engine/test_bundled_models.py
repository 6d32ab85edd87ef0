"""What the fast path and the reference both take from the bundled models, pinned: each model's eos and
control ids, and greedy continuations with their top log-probabilities (tests/fixtures/bundled_models.json,
from a plain transformers forward pass). A wrong GGUF conversion, tokenizer or eos set fails here, where it
would pass an agreement test on both sides alike."""

import json

import pytest
import torch

from adafuse import SingleConfig
from oracles.fast import decode
from oracles.reference import RefModel
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

PINNED = json.loads((ROOT / "tests/fixtures/bundled_models.json").read_text())["models"]


@pytest.mark.parametrize("index, name", [(0, "smollm2_135m"), (1, "gemma3_270m")])
def test_token_facts_are_the_pinned_ones(tiny, index, name):
    member, pinned = tiny.members[index], PINNED[name]
    assert member.name == name
    assert (
        member.runner.vocab_size == pinned["vocab_size"]
        and member.tokenisation.tokenizer.bos_token_id == pinned["bos_id"]
    )
    assert sorted(member.tokenisation.eos_ids) == pinned["eos_ids"]
    assert len(member.tokenisation.control_ids) == pinned["control_count"]
    assert sorted(member.tokenisation.control_ids)[: len(pinned["first_control_ids"])] == pinned["first_control_ids"]


@pytest.mark.parametrize("index, name", [(0, "smollm2_135m"), (1, "gemma3_270m")])
def test_greedy_continuations_and_their_log_probabilities_are_the_pinned_ones(tiny, index, name):
    member, reference = tiny.members[index], RefModel(tiny.members[index])
    for case in PINNED[name]["greedy"]:
        assert member.tokenisation.encode(case["prompt"]) == case["prompt_ids"]
        greedy_ids = [top[0] for top in case["top3_ids"]]
        eos = next((i for i, t in enumerate(greedy_ids) if t in member.tokenisation.eos_ids), len(greedy_ids))
        gen = decode(tiny.members, case["prompt"], SingleConfig(index), max_new_tokens=6, trace=True)
        assert gen.ids[0] == greedy_ids[:eos]
        steps = gen.trace.steps
        assert [s.logprob for s in steps] == pytest.approx([lp[0] for lp in case["top3_logprobs"][:eos]], abs=1e-3)
        # The reference reads the same distributions, with control tokens masked: each row is the raw one
        # renormalised, i.e. shifted by a constant, so the gaps between the top log-probabilities are the same.
        context = case["prompt_ids"] + greedy_ids
        top = reference.logprobs(context, len(greedy_ids) + 1)[:-1].topk(3)
        assert top.indices.tolist() == case["top3_ids"]
        pinned = torch.tensor(case["top3_logprobs"])
        assert torch.allclose(top.values - top.values[:, :1], pinned - pinned[:, :1], atol=1e-3)
