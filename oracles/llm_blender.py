"""LLM-Blender without a cache: every greedy step of every member and every score a full forward pass
over the whole token sequence (oracles/reference.py's cache-free model and spec §4 alignment), the greedy
answers and the NLL ranking written out as plainly as the method's docstring reads; and the comparison of
a fast decode with it."""

import pytest
import torch

from baselines.llm_blender import LLMBlenderConfig
from oracles import reference
from oracles.agreement import assert_scores_match
from oracles.fast import decode


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


def assert_llm_blender_agrees(members, prompt, stop, budget):
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
