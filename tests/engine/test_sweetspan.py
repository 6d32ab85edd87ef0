"""SweetSpan on the real bundled pair (and the pair in shape) against a slow implementation (oracles/sweetspan.py).

The slow side has no cache: every greedy step and every score is a full forward pass over the whole
token sequence (oracles/reference.py's cache-free model, word rule and spec §4 alignment); the
span round (proposals, pool, outlier filter, normalisation, winner) is written out there as plainly
as the method's docstring reads. Identical text, output ids, pools and winners; NLLs within 1e-4.
"""

import functools

import pytest

from baselines.sweetspan import SweetSpanConfig
from oracles.fast import decode
from oracles.sweetspan import assert_sweetspan_agrees
from tests.support.members import clone
from tests.support.prompts import nq_few_shot_case

pytestmark = pytest.mark.slow

# (prompt, stop strings, token budget): German text, digits, newline-terminated answers
PROMPTS = [
    ("Question: What is the capital of France?\nAnswer:", ["\n"], 8),
    ("Die Hauptstadt von Deutschland ist", [], 8),
    ("Übersetze ins Englische: Der Hund läuft über die Straße.\nEnglisch:", ["\n"], 8),
    ("The sum of 128 and 256 is", [], 8),
    ("The price is $18.50, and the tax is", [], 6),
    ("List three colors:\n", ["\n\n"], 8),
]


def test_sweetspan_equals_the_slow_implementation(tiny, tiny_shaped, shared_data):
    """The real pair on a stop-string answer, German and the paper's NQ few-shot prompt; every prompt on
    the pair in shape (conftest `tiny_shaped`), whose members never agree."""
    multi_span = 0
    for prompt, stop, budget in [PROMPTS[0], PROMPTS[2], nq_few_shot_case(shared_data, 6)]:
        gen = assert_sweetspan_agrees(tiny.members, prompt, stop, budget, SweetSpanConfig())
        multi_span += any(len(r.candidates) > 1 for r in gen.trace.steps)
    assert multi_span == 3  # the members disagree on each, so scores and the filter decide
    for prompt, stop, budget in PROMPTS:
        gen = assert_sweetspan_agrees(tiny_shaped, prompt, stop, budget, SweetSpanConfig())
        assert any(len(r.candidates) > 1 for r in gen.trace.steps)


# (options, the same without the option under test, prompt): each option changes some round's pool, scores or
# winner on its prompt (the token cap needs words of more than two tokens: " 1024." is three for Gemma).
@pytest.mark.parametrize(
    "options, without, at",
    [
        (dict(normalize=True), {}, 2),
        (dict(span_words=1), {}, 2),
        (dict(span_words=2, outlier_ratio=1.5), dict(span_words=2), 2),
        (dict(max_word_tokens=2), {}, 3),
        (dict(score="perplexity", outlier_ratio=1.5), dict(outlier_ratio=1.5), 2),
    ],
    ids=["normalize", "span_words=1", "outlier_ratio", "max_word_tokens=2", "perplexity"],
)
def test_options_equal_the_slow_implementation(tiny, options, without, at):
    prompt, stop, _ = PROMPTS[at]
    with_option = assert_sweetspan_agrees(tiny.members, prompt, stop, 6, SweetSpanConfig(**options))
    baseline = spans_without(tiny, tuple(without.items()), at)
    assert spans_of(with_option) != baseline, "the option changed no round: the agreement holds without it"


@functools.cache
def spans_without(tiny, without: tuple, at: int) -> list:
    """The span rounds of PROMPTS[at] under the options `without`, decoded once per worker (two option
    tests compare with the defaults on the same prompt)."""
    prompt, stop, _ = PROMPTS[at]
    cfg = SweetSpanConfig(**dict(without))
    return spans_of(decode(tiny.members, prompt, cfg, stop=stop, max_new_tokens=6, trace=True))


def spans_of(gen) -> list:
    """What a span round decided: each span's text, eos, proposers and fused score; the winner."""
    return [
        ([(c.text, c.eos, c.proposers, round(c.score, 4)) for c in r.candidates], r.winner) for r in gen.trace.steps
    ]


def test_three_members(tiny):
    members = [clone(tiny.members[i]) for i in (0, 1, 0)]  # the pair plus SmolLM2 again
    prompt, stop, _ = PROMPTS[1]
    gen = assert_sweetspan_agrees(members, prompt, stop, 6, SweetSpanConfig())
    assert len(gen.ids) == 3 and gen.ids[0] == gen.ids[2]


def test_stop_string_budget_and_eos(tiny, smol):
    prompt = "Question: What is the capital of France?\nAnswer:"
    free = decode(tiny.members, prompt, SweetSpanConfig(), max_new_tokens=12, trace=True)
    assert "\n" in free.text and free.stats.stop_reason == "length"
    assert max(free.stats.tokens_generated) >= 12
    gen = decode(tiny.members, prompt, SweetSpanConfig(), stop=["\n"], max_new_tokens=12, trace=True)
    assert gen.stats.stop_reason == "stop" and gen.text == free.text.split("\n")[0]
    # a span ends where its text completes a stop string: here at the "\n\n" that opens "\n\nQuestion:"
    last = gen.trace.steps[-1]
    stopped = [c.text for c in last.candidates if "\n" in c.text]
    assert stopped and all(t.split("\n", 1)[1].strip() == "" for t in stopped)
    chat = [type(smol)(smol.name, smol.tokenisation.tokenizer, smol.model, chat_template=True) for _ in range(2)]
    gen = decode(chat, "What is 2 + 2? Answer with one number.", SweetSpanConfig(), max_new_tokens=40, trace=True)
    assert gen.stats.stop_reason == "eos"
    winner = gen.trace.steps[-1].candidates[gen.trace.steps[-1].winner]
    assert winner.eos and all(s.eos for s in winner.scores)  # its score includes the eos token
    assert all(i not in smol.tokenisation.eos_ids for i in gen.ids[0])
