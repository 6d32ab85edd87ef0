"""LLM-Blender on the real bundled pair (and the pair in shape) against a slow implementation (oracles/llm_blender.py).

The slow side has no cache: every greedy step of every member and every score is a full forward pass
over the whole token sequence (oracles/reference.py's cache-free model and spec §4 alignment);
the greedy answers and the NLL ranking are written out there as plainly as the docstring reads.
"""

import pytest
import torch

from adafuse import SingleConfig
from adafuse.errors import ConfigError, UnknownNameError
from baselines.llm_blender import LLMBlenderConfig
from baselines.pairrm import load_pairrm
from oracles.fast import decode
from oracles.llm_blender import assert_llm_blender_agrees
from tests.support.members import clone
from tests.support.pairrm_checkpoint import write_checkpoint
from tests.support.prompts import nq_few_shot_case

pytestmark = pytest.mark.slow

# (prompt, stop strings, token budget): German text, digits, newline-terminated answers
PROMPTS = [
    ("Question: What is the capital of France?\nAnswer:", ["\n"], 10),
    ("Die Hauptstadt von Deutschland ist", ["\n"], 8),
    ("Übersetze ins Englische: Der Hund läuft über die Straße.\nEnglisch:", ["\n"], 12),
    ("The sum of 128 and 256 is", [], 8),
    ("Q: Who wrote Hamlet?\nA:", ["\n"], 10),
    ("List three colors:\n", ["\n\n"], 10),
]


def test_llm_blender_equals_the_slow_implementation(tiny, tiny_shaped, shared_data):
    """The real pair on a stop-string answer, German and the paper's NQ few-shot prompt; every prompt on
    the pair in shape (conftest `tiny_shaped`), whose members never agree."""
    ranked = 0
    for prompt, stop, budget in [PROMPTS[0], PROMPTS[2], nq_few_shot_case(shared_data, 10)]:
        gen = assert_llm_blender_agrees(tiny.members, prompt, stop, budget)
        ranked += gen.trace.steps[0].nll != []
    assert ranked == 3  # the members disagree on each, so the ranking decides
    for prompt, stop, budget in PROMPTS:
        gen = assert_llm_blender_agrees(tiny_shaped, prompt, stop, budget)
        assert gen.trace.steps[0].nll != []


def test_each_answer_is_method_single_output(tiny):
    prompt, stop, budget = PROMPTS[4]
    gen = decode(tiny.members, prompt, LLMBlenderConfig(), stop=stop, max_new_tokens=budget, trace=True)
    read = sum(bool(c) for c in gen.trace.steps[0].candidates) > 1  # two answers with text to read
    for k in range(2):
        alone = decode(tiny.members, prompt, SingleConfig(k), stop=stop, max_new_tokens=budget)
        assert gen.trace.steps[0].answers[k] == alone.text and gen.ids[k] == alone.ids[0]
        # cost: the member's greedy passes, plus one batched read of the answers after the prompt (read once)
        assert gen.stats.forward_passes[k] == alone.stats.forward_passes[0] + read


def test_three_members(tiny):
    members = [clone(tiny.members[i]) for i in (0, 1, 0)]  # the pair plus SmolLM2 again
    gen = assert_llm_blender_agrees(members, *PROMPTS[4])
    assert gen.trace.steps[0].answers[0] == gen.trace.steps[0].answers[2]
    assert len(gen.trace.steps[0].candidates) <= 2


def test_stop_string_budget_and_eos(tiny, smol):
    prompt = "Question: What is the capital of France?\nAnswer:"
    gen = decode(tiny.members, prompt, LLMBlenderConfig(), stop=["\n"], max_new_tokens=24, trace=True)
    assert "\n" not in gen.text and gen.stats.stop_reason == "stop"
    gen = decode(tiny.members, "The sum of 128 and 256 is", LLMBlenderConfig(), max_new_tokens=3, trace=True)
    assert gen.stats.stop_reason == "length" and gen.stats.tokens_generated == [3, 3]
    chat = [type(smol)(smol.name, smol.tokenisation.tokenizer, smol.model, chat_template=True) for _ in range(2)]
    gen = decode(chat, "What is 2 + 2? Answer with one number.", LLMBlenderConfig(), max_new_tokens=40, trace=True)
    assert gen.stats.stop_reason == "eos" and gen.trace.steps[0].chosen == 0  # identical answers: no ranking


def test_pairrm_ranker_picks_the_highest_score(tiny, tmp_path):
    write_checkpoint(tmp_path / "pairrm", "hf", seed=3)
    cfg = LLMBlenderConfig(ranker="pairrm", pairrm_path=str(tmp_path / "pairrm"))
    prompt, stop, budget = PROMPTS[4]
    gen = decode(tiny.members, prompt, cfg, stop=stop, max_new_tokens=budget, trace=True)
    (ranking,) = gen.trace.steps
    assert ranking.ranker == "pairrm" and len(ranking.candidates) == 2, ranking.answers
    scores, matrix = load_pairrm(cfg.pairrm_path).scores(prompt, ranking.candidates)
    assert torch.allclose(torch.tensor(ranking.matrix), matrix, atol=1e-5)
    best = max(range(2), key=scores.__getitem__)
    assert gen.text == ranking.candidates[best] and ranking.chosen == ranking.answers.index(gen.text)
    assert ranking.scores[0] == pytest.approx(-ranking.scores[1], abs=1e-6)  # two answers: opposite scores


def test_settings_that_make_no_sense_are_refused(tmp_path):
    with pytest.raises(UnknownNameError, match="Did you mean 'nll'"):
        LLMBlenderConfig(ranker="nl")
    with pytest.raises(ConfigError, match="holds no config.json"):
        LLMBlenderConfig(ranker="pairrm", pairrm_path=str(tmp_path))
    LLMBlenderConfig(ranker="nll", pairrm_path=str(tmp_path))  # the path matters only to ranker=pairrm
