"""LLM-Blender on the real bundled pair (and the pair in shape) against a slow implementation written here.

The slow side has no cache: every greedy step of every member and every score is a full forward pass
over the whole token sequence (adafuse/reference.py's cache-free model and spec §4 alignment);
the greedy answers and the NLL ranking are written out below as plainly as the docstring reads.
"""

import pytest
import torch

from adafuse import SingleConfig
from adafuse.errors import ConfigError, UnknownNameError
from baselines.llm_blender import LLMBlenderConfig
from baselines.pairrm import load_pairrm
from oracles import reference
from tests.unit.test_pairrm import write_checkpoint
from tools.testing import assert_scores_match, clone, decode, nq_few_shot_case

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


def slow_greedy(m: reference.RefModel, prompt_ids: list[int], stop, budget) -> str:
    """method=single without a cache: argmax of the raw distribution, control tokens left out of the text."""
    generated, text = [], ""
    while len(generated) < budget:
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids + generated])
            logits = m.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1]
        token = int(logits.argmax())
        if token in m.eos_ids:
            break
        generated.append(token)
        shown = m.text(prompt_ids, [t for t in generated if t not in m.control])
        if shown.endswith(reference.PARTIAL):
            continue
        text = shown
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return text[: min(hits)]
    return text


def slow_blender(members, prompt: str, stop, budget):
    """(answers, candidates, fused scores or None, chosen member, per-member (base, ids, skip, nll))."""
    run = reference.RefRun(members, prompt)  # each answer is read after the prompt, as a foreign candidate
    answers = [slow_greedy(m, c, stop, budget) for m, c in zip(run.models, run.contexts)]
    candidates = list(dict.fromkeys(answers))
    readable = [c for c in candidates if c]
    if len(readable) < 2:  # nothing to rank: the first non-empty answer, else member 0's
        return answers, candidates, None, answers.index(readable[0]) if readable else 0, None
    table = [[] for _ in run.models]  # table[member][candidate]
    for c in candidates:
        cand = reference.RefCandidate(c, False)
        if c:
            run.score(cand)
        for k, row in enumerate(table):
            row.append(cand.scores[k] if c else (0, [], 0, float("inf")))
    fused = [sum(row[i][3] for row in table) / len(run.models) for i in range(len(candidates))]
    best = min(range(len(candidates)), key=lambda i: fused[i])
    return answers, candidates, fused, answers.index(candidates[best]), table


def assert_agree(members, prompt, stop, budget):
    fast = decode(members, prompt, LLMBlenderConfig(), stop=stop, max_new_tokens=budget, trace=True)
    answers, candidates, fused, chosen, table = slow_blender(members, prompt, stop, budget)
    (ranking,) = fast.trace.steps
    assert ranking.ranker == "nll"
    assert ranking.answers == answers and ranking.candidates == candidates
    assert ranking.chosen == chosen and fast.text == answers[chosen]
    if fused is not None:
        assert ranking.scores == pytest.approx(fused, abs=1e-4)
        for fast_row, slow_row in zip(ranking.nll, table):
            assert_scores_match(fast_row, slow_row)
    return fast


def test_llm_blender_equals_the_slow_implementation(tiny, tiny_shaped, shared_data):
    """The real pair on a stop-string answer, German and the paper's NQ few-shot prompt; every prompt on
    the pair in shape (conftest `tiny_shaped`), whose members never agree."""
    ranked = 0
    for prompt, stop, budget in [PROMPTS[0], PROMPTS[2], nq_few_shot_case(shared_data, 10)]:
        gen = assert_agree(tiny.members, prompt, stop, budget)
        ranked += gen.trace.steps[0].nll != []
    assert ranked == 3  # the members disagree on each, so the ranking decides
    for prompt, stop, budget in PROMPTS:
        gen = assert_agree(tiny_shaped, prompt, stop, budget)
        assert gen.trace.steps[0].nll != []


def test_each_answer_is_method_single_output(tiny):
    prompt, stop, budget = PROMPTS[4]
    gen = decode(tiny.members, prompt, LLMBlenderConfig(), stop=stop, max_new_tokens=budget, trace=True)
    read = sum(bool(c) for c in gen.trace.steps[0].candidates) > 1  # two answers with text to read
    for k in range(2):
        alone = decode(tiny.members, prompt, SingleConfig(k), stop=stop, max_new_tokens=budget)
        assert gen.trace.steps[0].answers[k] == alone.text and gen.ids[k] == alone.ids[0]
        # cost: the member's greedy passes, plus one re-read of the prompt's last token and one batched read
        assert gen.stats.forward_passes[k] == alone.stats.forward_passes[0] + 2 * read


def test_three_members(tiny):
    members = [clone(tiny.members[i]) for i in (0, 1, 0)]  # the pair plus SmolLM2 again
    gen = assert_agree(members, *PROMPTS[4])
    assert gen.trace.steps[0].answers[0] == gen.trace.steps[0].answers[2]
    assert len(gen.trace.steps[0].candidates) <= 2


def test_stop_string_budget_and_eos(tiny, smol):
    prompt = "Question: What is the capital of France?\nAnswer:"
    gen = decode(tiny.members, prompt, LLMBlenderConfig(), stop=["\n"], max_new_tokens=24, trace=True)
    assert "\n" not in gen.text and gen.stats.stop_reason == "stop"
    gen = decode(tiny.members, "The sum of 128 and 256 is", LLMBlenderConfig(), max_new_tokens=3, trace=True)
    assert gen.stats.stop_reason == "length" and gen.stats.tokens_generated == [3, 3]
    chat = [type(smol)(smol.name, smol.tokenizer, smol.model, chat_template=True) for _ in range(2)]
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
