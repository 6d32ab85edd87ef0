"""Behaviour the spec promises for the knobs tau, M, B, K. The knobs' logic runs on the paper's pair in
shape (real Llama-3 and Mistral tokenizers, tiny random weights: fast); what depends on real outputs
(an uncertain first word, stop reasons, control tokens, and greedy text, which a random model often
breaks mid-character where AdaFuse keeps text Unicode) on the real bundled pair."""

import copy

import pytest
import torch

from adafuse import AdaFuseConfig, Ensemble, SingleConfig
from adafuse.engine.loop import drive
from adafuse.errors import ContextLengthError, NumericsError
from adafuse.member.member import Member
from adafuse.methods.completion import Word, complete_words, cut_to_char
from oracles.fast import decode
from tests.support.bad_inputs import bad_input, pattern
from tests.support.members import clone, long_reads_stopped
from tests.support.prompts import nq_prompt

pytestmark = pytest.mark.slow

QA = "Question: who wrote the novel Moby Dick?\nAnswer:"
MT = "Translate into German: The cat sleeps on the warm sofa.\nGerman:"
STORY = "Once upon a time, in a small village,"


def test_tau_zero_commits_max_words_per_model_every_round(paper_pair):
    gen = decode(paper_pair.members, STORY, AdaFuseConfig(tau=0.0, max_words=3), max_new_tokens=24, trace=True)
    for rnd in gen.trace.rounds:
        for model_round in rnd.models:
            assert not model_round.branched
            assert len(model_round.committed) == 3 or rnd.candidates[0].eos
        assert len(rnd.candidates) <= len(paper_pair.members)  # one candidate per model, merged when equal
    assert all(words == 3 for words in gen.stats.words_per_round[:-1])


def test_tau_above_one_ends_every_round_after_one_word(paper_pair):
    gen = decode(paper_pair.members, MT, AdaFuseConfig(tau=1.01), max_new_tokens=16, trace=True)
    assert gen.stats.rounds >= 3
    assert gen.stats.words_per_round == [1] * gen.stats.rounds
    for rnd in gen.trace.rounds:
        assert all(m.branched and m.committed == [] and len(m.margins) == 1 for m in rnd.models)


def test_branches_explore_distinct_first_tokens_after_the_committed_words(tiny):
    one = decode(tiny.members, QA, AdaFuseConfig(branches=1), stop=["\n"], max_new_tokens=4, trace=True)
    three = decode(tiny.members, QA, AdaFuseConfig(branches=3), stop=["\n"], max_new_tokens=4, trace=True)
    first_one, first_three = one.trace.rounds[0], three.trace.rounds[0]
    for k, model_round in enumerate(first_three.models):
        assert model_round.branched  # this prompt starts uncertain for both small models
        own = [c for c in first_three.candidates if k in c.proposers]
        assert len(own) == 3  # B candidates: the committed words + one word per first token
        assert len({c.scores[k].ids[0] for c in own}) == 3  # distinct first tokens
        assert all(c.text.startswith("".join(model_round.committed)) for c in own)
        (greedy_only,) = [c for c in first_one.candidates if k in c.proposers]  # B = 1: one candidate
        assert greedy_only.text in {c.text for c in own}
    assert all(len(r.candidates) <= len(tiny.members) for r in one.trace.rounds)


@pytest.mark.parametrize("prompt, stop", [(QA, ["\n"]), (MT, ["\n"]), (STORY, ["."])])
def test_one_model_with_one_branch_is_greedy_decoding(tiny, prompt, stop):
    for k, member in enumerate(tiny.members):
        alone = decode([member], prompt, AdaFuseConfig(branches=1), stop=stop, max_new_tokens=40)
        reference = decode(tiny.members, prompt, SingleConfig(k), stop=stop, max_new_tokens=40)
        if "length" in (alone.stats.stop_reason, reference.stats.stop_reason):
            assert alone.text.startswith(reference.text) or reference.text.startswith(alone.text)
        else:
            assert alone.text == reference.text


def test_a_model_paired_with_itself_reproduces_its_greedy_output(paper_pair):
    llama = paper_pair.members[0]
    pair = [llama, clone(llama)]
    for prompt, stop in [(QA, ["\n"]), (MT, ["\n"])]:
        selfpair = decode(pair, prompt, AdaFuseConfig(branches=1), stop=stop, max_new_tokens=40)
        assert selfpair.text == decode([llama], prompt, SingleConfig(0), stop=stop, max_new_tokens=40).text
        # with branches too, two copies of one model decide exactly as the model alone
        paired = decode(pair, prompt, AdaFuseConfig(), stop=stop, max_new_tokens=24, trace=True)
        alone = decode([llama], prompt, AdaFuseConfig(), stop=stop, max_new_tokens=24)
        assert paired.text == alone.text
        for rnd in paired.trace.rounds:
            for c in rnd.candidates:
                assert c.proposers == [0, 1] and c.scores[0].nll == pytest.approx(c.scores[1].nll, abs=1e-4)


def test_stop_reasons_and_budget(tiny):
    gen = decode(tiny.members, QA, AdaFuseConfig(), stop=["\n"], max_new_tokens=40)
    assert gen.stats.stop_reason == "stop" and "\n" not in gen.text
    gen = decode(tiny.members, STORY, AdaFuseConfig(), max_new_tokens=10)
    assert gen.stats.stop_reason == "length"
    assert max(gen.stats.tokens_generated) >= 10 > max(gen.stats.tokens_generated) - 3 * 20  # at most one round over
    assert [len(i) for i in gen.ids] == gen.stats.tokens_generated
    for member, ids in zip(tiny.members, gen.ids):
        assert member.text_of(ids, member.tokenisation.encode(STORY)) == gen.text  # every model read exactly the output


def test_stats_count_forward_passes_and_tokens(tiny):
    gen = decode(tiny.members, QA, AdaFuseConfig(), stop=["\n"], max_new_tokens=16)
    stats = gen.stats
    assert stats.rounds == len(stats.words_per_round) >= 1
    assert all(f >= stats.rounds for f in stats.forward_passes)
    assert all(fed >= generated for fed, generated in zip(stats.tokens_fed, stats.tokens_generated))
    assert stats.seconds > 0


@pytest.mark.parametrize("options, what", [({}, "margin is NaN"), ({"fixed_words": 1}, "NLL of")])
def test_non_finite_logits_are_a_named_error_naming_model_and_round(tiny_shaped, options, what):
    """A NaN margin would count as confident and a NaN score could win: both stop decoding with a named error.
    On the pair in shape (conftest `tiny_shaped`): what breaks is the numbers, whatever the weights."""
    smol, gemma = tiny_shaped
    broken_model = copy.deepcopy(smol.model)
    broken_model.model.norm.weight.data.fill_(float("nan"))  # every logit becomes NaN, as in a fp16 overflow
    broken = Member("broken_smollm2", smol.tokenisation.tokenizer, broken_model)
    with pytest.raises(NumericsError, match=rf"model 'broken_smollm2'.*{what}.*round 0|{what}.*round 0"):
        decode([clone(gemma), broken], QA, AdaFuseConfig(**options), stop=["\n"], max_new_tokens=8)


def test_control_tokens_never_form_words(tiny, gemma, shared_data):
    """Spec §2: Gemma's added tokens (e.g. <start_of_image>, not flagged special) and specials are out
    of its distribution for every method but `single`; its whitespace runs and eos stay in. On NQ
    question nq-4 Gemma's own greedy output is <start_of_image> repeated (tests/engine/test_greedy.py)."""
    names = gemma.tokenisation.tokenizer.convert_ids_to_tokens
    control = {
        gemma.tokenisation.tokenizer.convert_tokens_to_ids(t) for t in ["<start_of_image>", "<bos>", "<pad>", "<table>"]
    }
    assert control <= gemma.tokenisation.control_ids
    assert not gemma.tokenisation.control_ids & gemma.tokenisation.eos_ids
    assert (
        not {gemma.tokenisation.tokenizer.convert_tokens_to_ids(t) for t in ["\n\n", "\t\t"]}
        & gemma.tokenisation.control_ids
    )
    prompt, stop = nq_prompt(shared_data, "nq-4")
    gen = decode(tiny.members, prompt, AdaFuseConfig(), stop=stop, max_new_tokens=12, trace=True)
    assert "<start_of_image>" not in gen.text
    for rnd in gen.trace.rounds:
        for c in rnd.candidates:
            for k, (m, score) in enumerate(zip(tiny.members, c.scores)):
                assert not set(score.ids) & m.tokenisation.control_ids, names(score.ids) if k else score.ids
    m = clone(gemma)
    drive(m.start(prompt))
    assert m.logprobs[sorted(m.tokenisation.control_ids)].max() == float("-inf")
    drive(m.start(prompt, mask_control=False))
    assert m.logprobs[sorted(m.tokenisation.control_ids)].max() > float("-inf")


def test_a_word_cut_at_the_token_cap_never_ends_inside_a_character(smol):
    """SmolLM2 spells an emoji over several byte tokens: a word capped at 1 token runs on to finish the
    character; a word that the slack cannot finish is cut back to its last character boundary."""
    m = clone(smol)
    drive(m.start("🍕🍕🍕🍕🍕🍕🍕🍕"))
    rows = m.fork(1)
    (word,) = drive(complete_words(m, rows, [int(m.logprobs.argmax())], m.logprobs, [], max_tokens=1))
    assert word.text == "🍕" and len(word.ids) == 3 and not word.cut  # 1 token would end inside the emoji
    assert rows.tokens[0] == word.ids and torch.equal(rows.last[0], word.next_logprobs)

    pizza = m.tokenisation.encode_text("🍕")
    partial = pizza + pizza[:1]  # a second emoji begun and never finished
    rows = m.fork(1)
    dists = [drive(rows.extend([[t]]))[0, 0] for t in partial]
    unfinished = Word(partial, [0.0] * 4, m.text_of(partial), False, dists[-1])
    cut = cut_to_char(m, rows, 0, unfinished, dists, m.ids)
    assert (cut.ids, cut.text, cut.cut) == (pizza, "🍕", True)
    assert rows.tokens[0] == pizza and torch.equal(rows.last[0], dists[len(pizza) - 1])
    m.commit(rows, 0, "", cut.text)
    m.check_invariant()
    assert m.text_of(m.generated_ids, m.ids[: m.prompt_len]) == "🍕"


LONG = "word " * 9000  # 9,001 tokens for SmolLM2 (8,192 positions), far fewer than Gemma-3's 32,768


@pytest.mark.parametrize("entry", ["decode", "decode_batch", "decode_stream"])
def test_a_prompt_longer_than_a_models_context_is_refused_before_any_model_reads_it(tiny_shaped, entry, tmp_path):
    """Refused before Gemma-3 reads it (the model with room for it, second of the pair): a model that read it
    whole first (minutes, on the real Gemma-3) is stopped here by the hook on its pass."""

    ensemble = Ensemble(tiny_shaped)
    with long_reads_stopped(tiny_shaped) as long_reads, pytest.raises(ContextLengthError) as refused:
        if entry == "decode":
            ensemble.decode(LONG, max_new_tokens=4)
        elif entry == "decode_batch":
            ensemble.decode_batch(["Question: 2 + 2?\nAnswer:", LONG], max_new_tokens=4)
        else:
            list(ensemble.decode_stream(enumerate(["Question: 2 + 2?\nAnswer:", LONG]), max_new_tokens=4))
    assert long_reads == []
    assert pattern(bad_input("api_long_prompt").message, tmp_path).fullmatch(str(refused.value)), refused.value
    assert "smollm2_135m" in str(refused.value)
