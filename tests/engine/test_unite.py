"""UniTE on the real bundled pair against a slow, plain implementation (oracles/unite.py: no cache, every
distribution from a full forward pass), plus its union, missing-string mapping, K = 3, stop rules."""

import pytest
import torch

from adafuse.errors import ConfigError
from baselines import unite
from baselines.unite import EOS, UniteConfig, first_subtoken
from baselines.vocab import vocabulary_of
from oracles.fast import decode
from oracles.unite import slow_unite
from tests.support.members import clone
from tests.support.prompts import TOKEN_METHOD_CASES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("prompt, stop, budget", TOKEN_METHOD_CASES)
def test_unite_equals_the_plain_reference(tiny, prompt, stop, budget):
    gen = decode(tiny.members, prompt, UniteConfig(), stop=stop, max_new_tokens=budget)
    text, reason, ids = slow_unite(tiny.members, prompt, 10, [0.5, 0.5], stop, budget)
    assert (gen.text, gen.stats.stop_reason) == (text, reason)
    assert gen.ids == ids
    for m in tiny.members:
        m.check_invariant()


def test_the_union_holds_every_members_top_k_by_text_and_the_fused_values_average_them(tiny):
    from adafuse.engine.loop import drive
    from adafuse.methods.session import Request, Session

    members = [clone(m) for m in tiny.members]  # started here: whatever ran before on this worker, or nothing
    drive(Session(members, Request("Question: Which river flows through Vienna?\nAnswer:"), reserve=8).start())
    vocabs = [vocabulary_of(m) for m in members]
    step, tops = unite.fuse(members, vocabs, [0.3, 0.7], 10, [{}, {}])
    assert [len(t) for t in tops] == [10, 10]
    assert step.union[:10] == list(tops[0]) and set(step.union) == set(tops[0]) | set(tops[1])
    assert len(step.union) == len(set(step.union))
    for m, v, top in zip(members, vocabs, tops):
        for entry, i in top.items():
            assert entry is EOS or v.texts[i] == entry and m.text_of([i]) == entry  # text, in context
    for values in step.values:
        assert sum(values) == pytest.approx(1.0, abs=1e-6)
    fused = [0.3 * a + 0.7 * b for a, b in zip(*step.values)]
    assert step.fused == pytest.approx(fused)
    assert step.winner == max(range(len(fused)), key=lambda j: fused[j])


def test_a_string_missing_from_a_vocabulary_maps_to_its_first_subtoken_that_is_not_a_bare_space(smol, gemma):
    v_smol, v_gemma = vocabulary_of(smol), vocabulary_of(gemma)
    # " Größe" is one Gemma token; SmolLM2 spells it "ĠGr" "Ã¶" "ÃŁ" "e": its value is p("ĠGr").
    assert v_gemma.ids_of(" Größe") and not v_smol.ids_of(" Größe")
    probs = torch.softmax(torch.randn(smol.runner.vocab_size, generator=torch.Generator().manual_seed(0)), dim=0)
    first = smol.tokenisation.encode_text(" Größe")[0]
    assert v_smol.texts[first] == " Gr"
    assert unite.member_value(smol, v_smol, probs, " Größe", {}) == pytest.approx(probs[first].item())
    # A whole token is looked up, summed over every id that spells it (Gemma: "\n" and <0x0A>).
    probs = torch.softmax(torch.randn(gemma.runner.vocab_size, generator=torch.Generator().manual_seed(1)), dim=0)
    newline = v_gemma.ids_of("\n")
    assert len(newline) == 2
    assert unite.member_value(gemma, v_gemma, probs, "\n", {}) == pytest.approx(probs[newline].sum().item())
    # Bare-space tokens are found from the vocabulary (never hard-coded ids) and skipped.
    assert {smol.tokenisation.tokenizer.convert_ids_to_tokens(i) for i in v_smol.bare_space} == {"Ġ"}
    assert {gemma.tokenisation.tokenizer.convert_ids_to_tokens(i) for i in v_gemma.bare_space} == {"▁", "<0x20>"}
    space = sorted(v_gemma.bare_space)[0]
    assert first_subtoken([space, 42], v_gemma) == 42 and first_subtoken([space], v_gemma) == space


def test_three_members_with_a_clone_match_the_reference(tiny, smol):
    members = [*tiny.members, clone(smol)]
    prompt = "Question: Who wrote Hamlet?\nAnswer:"
    cfg = UniteConfig(weights=[0.25, 0.5, 0.25])
    gen = decode(members, prompt, cfg, stop=["\n"], max_new_tokens=8)
    text, reason, ids = slow_unite(members, prompt, 10, [0.25, 0.5, 0.25], ["\n"], 8)
    assert (gen.text, gen.stats.stop_reason, gen.ids) == (text, reason, ids)
    assert gen.ids[0] == gen.ids[2] and len(gen.stats.forward_passes) == 3


def test_stop_string_budget_and_eos(tiny, smol):
    members = tiny.members
    gen = decode(
        members, "Question: What is the capital of France?\nAnswer:", UniteConfig(), stop=["is"], max_new_tokens=30
    )
    assert gen.stats.stop_reason in ("stop", "eos") and "is" not in gen.text
    gen = decode(members, "Once upon a time", UniteConfig(), max_new_tokens=5)
    assert gen.stats.stop_reason == "length" and max(gen.stats.tokens_generated) >= 5
    assert max(gen.stats.tokens_generated) < 5 + unite.STEP_OVERRUN
    # SmolLM2 with itself ends its chat answer with <|im_end|>, its eos: "end of sequence" wins the union.
    twin = [smol, clone(smol)]
    chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    gen = decode(twin, chat, UniteConfig(), max_new_tokens=40)
    assert gen.stats.stop_reason == "eos" and "<|im_end|>" not in gen.text


@pytest.mark.parametrize("knobs", [dict(top_k=0), dict(weights=[0.5, 0.6]), dict(weights=[1.2, -0.2])])
def test_settings_that_make_no_sense_are_refused(knobs):
    with pytest.raises(ConfigError):
        UniteConfig(**knobs)


def test_weights_must_match_the_number_of_members(tiny):
    with pytest.raises(ConfigError, match="3 weights for 2 members"):
        decode(tiny.members, "Hi", UniteConfig(weights=[0.2, 0.3, 0.5]), max_new_tokens=2)
