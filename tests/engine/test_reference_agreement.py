"""The fast decoder (KV cache, batched forks, no re-reading) must agree exactly with the slow reference.

Identical text, identical candidate pools (text, eos, proposers) and winners in every round, the
same scored ids per model, and NLLs equal within 1e-4, on the real bundled pair; where the bookkeeping
is the point (every kind of prompt boundary, K = 1..4 members, chat templates), also or only on the
pair in shape (real tokenizers, tiny random weights: conftest `tiny_shaped`).
"""

import functools

import pytest
import torch

from adafuse import AdaFuseConfig
from oracles import reference
from oracles.agreement import assert_adafuse_agrees, exercised
from oracles.fast import decode
from tests.support.members import WINDOW, clone

pytestmark = pytest.mark.slow

# (prompt, stop strings, token budget): one prompt per kind of boundary (a stop string, a blank-line stop,
# digits, umlauts, tabs, CJK, an emoji, code, trailing spaces); the paper-shaped pair's tests run the same
# kinds through Llama-3's and Mistral's tokenizers (tests/engine/test_paper_pair_methods.py).
PROMPTS = [
    ("Question: What is the capital of France?\nAnswer:", ["\n"], 4),
    ('Q: What does "carpe diem" mean?\nA:', ["\n\n"], 4),
    ("The sum of 128 and 256 is", [], 4),
    ("Übersetze ins Englische: Der Hund läuft über die Straße.\nEnglisch:", ["\n"], 4),
    ("Name:\tAlice\nAge:\t", [], 4),
    ("日本の首都は", [], 3),
    ("I love pizza 🍕 because", [], 4),
    ("def add(a, b):\n    return", ["\n\n"], 4),
    ("Answer:  ", [], 4),
    ("Translate to German: The weather is nice today.\nGerman:", ["\n"], 4),
]


ONE_SHOT = "Question: who wrote Hamlet?\nAnswer: William Shakespeare\n\nQuestion: Who painted the Mona Lisa?\nAnswer:"


def test_early_finish_ends_as_the_full_round_would_and_as_the_reference_does(tiny):
    """After " Leonardo da Vinci" every candidate of the round starts with a newline, the stop: the round
    ends there, unscored, with the text and stop reason the full round gives (whichever candidate it
    chose), the same rounds before it, and output ids that are the committed rounds' (so a prefix of the
    full run's, which also committed the last winner's ids). Both ways agree with the reference."""
    early = assert_adafuse_agrees(tiny.members, ONE_SHOT, ["\n"], 8, AdaFuseConfig())
    full = assert_adafuse_agrees(tiny.members, ONE_SHOT, ["\n"], 8, AdaFuseConfig(), early_finish=False)
    assert early.stats.early_finish and not full.stats.early_finish
    assert (
        (early.text, early.stats.stop_reason) == (full.text, full.stats.stop_reason) == (" Leonardo da Vinci", "stop")
    )
    assert rounds_of(early) == rounds_of(full)[:-1] and full.stats.rounds == early.stats.rounds + 1
    assert early.stats.words_per_round == full.stats.words_per_round[:-1]
    for early_ids, full_ids in zip(early.ids, full.ids):
        assert full_ids[: len(early_ids)] == early_ids and len(full_ids) > len(early_ids)
    assert all(e < f for e, f in zip(early.stats.forward_passes, full.stats.forward_passes))


# The real pair reads three kinds (a stop string, umlauts, CJK) and, in the option checks below, the emoji;
# the pair in shape reads every kind: its random text crosses scripts and characters at every step.
ON_THE_REAL_PAIR = [PROMPTS[0], PROMPTS[3], PROMPTS[5]]


@pytest.mark.parametrize("case", ON_THE_REAL_PAIR, ids=lambda c: c[0][:20])
def test_fast_decoder_equals_reference_on_varied_prompts(tiny, case):
    prompt, stop, budget = case
    assert_adafuse_agrees(tiny.members, prompt, stop, budget, AdaFuseConfig())


def test_fast_decoder_equals_reference_on_every_kind_of_prompt_in_shape(tiny_shaped):
    rounds = foreign = cut_backs = 0
    for prompt, stop, budget in PROMPTS:
        counts = exercised(assert_adafuse_agrees(tiny_shaped, prompt, stop, budget, AdaFuseConfig()))
        rounds, foreign, cut_backs = rounds + counts[0], foreign + counts[1], cut_backs + counts[2]
    assert rounds > len(PROMPTS) and foreign >= 1 and cut_backs >= 1, (rounds, foreign, cut_backs)


def test_fast_decoder_equals_reference_past_the_sliding_window(narrow, gemma):
    """Gemma-3 with its window narrowed (conftest `narrow`): the prompt crosses it, and every round reads
    its candidates past it through the cache, as a prompt past the real 512 tokens would."""
    prompt = (
        "Question: A pen costs 3 dollars and a notebook costs 5 dollars. How much do 4 pens and 2 notebooks "
        "cost together?\nLet's think step by step\n"
    )
    gen = assert_adafuse_agrees(narrow, prompt, ["\n\nQuestion:"], 5, AdaFuseConfig())
    ids = gen.trace.prompt_ids[1]
    assert len(ids) > WINDOW
    narrowed = reference.RefModel(narrow[1]).next_logprobs(ids)
    assert not torch.allclose(narrowed, reference.RefModel(gemma).next_logprobs(ids), atol=1e-2)  # in effect


def test_the_reference_computes_each_prefix_row_once_as_a_full_pass_over_it_would(tiny_shaped, monkeypatch):
    """A candidate's NLL reads the rows that generating it computed (one row per prefix), and a row served
    that way is the one a cache-free pass over the prefix itself gives."""
    monkeypatch.setattr(reference, "MEMO", None)
    m = reference.RefModel(tiny_shaped[1])
    passes = []
    forward = m._forward
    monkeypatch.setattr(m, "_forward", lambda ids, last: passes.append((len(ids), last)) or forward(ids, last))
    ids = m.encode_prompt("Question: What is the capital of France?\nAnswer:")
    steps = [m.next_logprobs(ids[:n]) for n in range(len(ids) - 2, len(ids) + 1)]
    assert passes == [(len(ids) - 2, 1), (len(ids) - 1, 1), (len(ids), 1)]
    rows = m.logprobs(ids, 3)
    assert len(passes) == 3 and all(torch.equal(row, step) for row, step in zip(rows, steps))
    wider = m.logprobs(ids + [ids[-1]], 5)  # three of its rows known: one pass for the other two
    assert passes[3:] == [(len(ids) + 1, 5)] and torch.equal(wider[1:4], rows)
    alone = reference.RefModel(tiny_shaped[1])._forward(ids[:-3], 1)[-1]
    assert torch.allclose(wider[0], alone, atol=1e-5)


def test_the_session_memo_serves_a_pass_only_to_that_same_pass(tiny_shaped, monkeypatch):
    """A run reads from the session's memo exactly what it would compute without it, whichever runs came
    first: a prefix's row from a longer pass (equal only up to float rounding) is never served to a pass
    over the prefix itself, and the same pass, asked again by a fresh run, gets its rows bit for bit."""
    monkeypatch.setattr(reference, "MEMO", reference.LogprobMemo(2**24))
    member = tiny_shaped[1]
    ids = reference.RefModel(member).encode_prompt("Question: What is the capital of France?\nAnswer:")
    long_pass = reference.RefModel(member).logprobs(ids, 4)  # the rows of the prefixes ids[:-3] .. ids
    short_pass = reference.RefModel(member).logprobs(ids[:-2], 1)  # a prefix the long pass holds a row of
    assert (reference.MEMO.hits, reference.MEMO.misses) == (0, 2)
    assert torch.equal(short_pass, reference.RefModel(member)._forward(ids[:-2], 1))
    again = reference.RefModel(member).logprobs(ids, 4)
    assert reference.MEMO.hits == 1 and torch.equal(again, long_pass)


# Each option changes some round on the first prompt (a stop string); the options that shape words also
# read the emoji prompt, where a word's tokens end inside a character.
@pytest.mark.parametrize(
    "options, prompts",
    [
        (dict(tau=0.0), [0, 6]),  # every word confident: M words per model per round
        (dict(tau=1.5), [0]),  # never confident: one word per round
        (dict(branches=1), [0]),
        (dict(max_words=1), [0]),
        (dict(fixed_words=2), [0, 6]),
        (dict(diversity=False), [0]),
        (dict(max_word_tokens=2), [0, 6]),
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) if isinstance(o, dict) else f"prompts {o}",
)
def test_options_agree_with_reference(tiny, options, prompts):
    for i in prompts:
        prompt, stop, _ = PROMPTS[i]
        with_option = assert_adafuse_agrees(tiny.members, prompt, stop, 4, AdaFuseConfig(**options))
        assert rounds_of(with_option) != without_options(tiny, i), f"{options} changed no round of {prompt!r}"


@functools.cache
def without_options(tiny, i: int) -> list:
    """The rounds of PROMPTS[i] with every option at its default, decoded once per worker: every option
    test compares with them."""
    prompt, stop, _ = PROMPTS[i]
    return rounds_of(decode(tiny.members, prompt, AdaFuseConfig(), stop=stop, max_new_tokens=4, trace=True))


def rounds_of(gen) -> list:
    """What a round decided: each candidate's text, eos, proposers, words and fused NLL; the winner."""
    return [
        ([(c.text, c.eos, c.proposers, c.words, round(c.fused, 4)) for c in r.candidates], r.winner)
        for r in gen.trace.rounds
    ]


@pytest.mark.parametrize("order", [[0], [1, 0], [0, 1, 0], [1, 0, 1, 0]], ids=["K=1", "K=2 reversed", "K=3", "K=4"])
def test_ensembles_of_one_to_four_models_agree_with_reference(tiny_shaped, order):
    members = [clone(tiny_shaped[i]) for i in order]  # own context and cache, shared weights
    prompt, stop, _ = PROMPTS[9]
    assert_adafuse_agrees(members, prompt, stop, 4, AdaFuseConfig())


# Prompts that end in a space, a newline and a blank line: the boundary re-tokenises, and a member's
# own winning ids are often not its tokenizer's canonical encoding of the text.
LONG_PROMPTS = [
    "Write one sentence about a cat.\nSentence: ",
    "List three colors:\n",
    "Question: Name three German cities.\nAnswer:\n\n",
]


# Twelve tokens are six rounds or more on each prompt, with foreign winners and cut-backs among them (on the
# "\n\n" prompt Gemma's beam has every hypothesis finish in one step, an empty selection of rows: the beam
# variant reads another prompt).
@pytest.mark.parametrize(
    "diversity, prompts",
    [(True, LONG_PROMPTS[2:]), (False, LONG_PROMPTS[1:2])],
    ids=["branches", "beam"],
)
def test_long_generations_agree_with_reference_through_cut_backs_and_foreign_winners(tiny, diversity, prompts):
    rounds = foreign = cut_backs = 0
    for prompt in prompts:
        gen = assert_adafuse_agrees(tiny.members, prompt, [], 12, AdaFuseConfig(diversity=diversity))
        counts = exercised(gen)
        rounds, foreign, cut_backs = rounds + counts[0], foreign + counts[1], cut_backs + counts[2]
    assert rounds >= 6 * len(prompts) and foreign >= 1 and cut_backs >= 1, (rounds, foreign, cut_backs)


def test_chat_template_members_agree_with_reference(tiny_shaped):
    smol = tiny_shaped[0]
    smol_chat = type(smol)(smol.name, smol.tokenisation.tokenizer, smol.model, chat_template=True)
    members = [smol_chat, clone(tiny_shaped[1])]  # SmolLM2 reads its ChatML rendering; Gemma has no template
    for prompt, stop, _ in [PROMPTS[0], PROMPTS[3]]:
        gen = assert_adafuse_agrees(members, prompt, stop, 4, AdaFuseConfig())
        assert gen.trace.prompt_ids[0][:1] == smol_chat.tokenisation.tokenizer.convert_tokens_to_ids(["<|im_start|>"])
