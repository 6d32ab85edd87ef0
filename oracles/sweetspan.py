"""SweetSpan without a cache: every greedy step and every score a full forward pass over the whole token
sequence (oracles/reference.py's cache-free model, word rule and spec §4 alignment), the span round
(proposals, pool, outlier filter, normalisation, winner) written out as plainly as the method's docstring
reads; and the comparison of a fast decode with it."""

import math

import pytest

from baselines.sweetspan import SweetSpanConfig
from oracles import reference
from oracles.agreement import assert_scores_match
from oracles.fast import decode


def slow_sweetspan(members, prompt: str, cfg: SweetSpanConfig, stop, budget):
    """Returns (text, rounds, output ids); a round is (pool, fused scores, winner)."""
    run, rounds = reference.RefRun(members, prompt), []
    while True:
        pool = {}  # (text, eos) -> RefCandidate, in insertion order
        for k, m in enumerate(run.models):
            words, here, span = [], list(run.contexts[k]), ""
            while len(words) < cfg.span_words:
                first = m.best(m.next_logprobs(here), [])[0]  # a token that can start a character
                # a first token that completes a stop string is the span's last word, alone
                stops = first not in m.eos_ids and any(s in run.text + span + m.text(here, [first]) for s in stop)
                word = reference.greedy_word(m, here, first, 1 if stops else cfg.max_word_tokens)
                words.append(word)
                here += word.ids
                span += word.text
                if word.eos or word.cut or stops or any(s in run.text + span for s in stop):
                    break
            key = ("".join(w.text for w in words), words[-1].eos)
            cand = pool.setdefault(key, reference.RefCandidate(*key))
            cand.proposers.append(k)
            cand.own[k] = [i for w in words for i in w.ids]
        pool = list(pool.values())
        for cand in pool:
            run.score(cand)
        table = [[s[3] for s in cand.scores] for cand in pool]  # table[span][member]
        if cfg.score == "perplexity":
            table = [[math.exp(v) for v in row] for row in table]
        if cfg.normalize:
            means = [sum(row[k] for row in table) / len(table) for k in range(len(run.models))]
            table = [[v / mean if mean else 0.0 for v, mean in zip(row, means)] for row in table]
        fused = []
        for row in table:
            values = sorted(row)
            if values[-1] > cfg.outlier_ratio * values[0]:  # drop both extremes, or the largest alone
                values = values[1:-1] or values[:1]
            fused.append(sum(values) / len(values))
        winner = min(range(len(pool)), key=lambda i: fused[i])
        rounds.append((pool, fused, winner))
        run.commit(pool[winner])
        end = run.ended(pool[winner].eos, stop, budget)
        if end:
            return end[0], rounds, end[1]


def assert_sweetspan_agrees(members, prompt, stop, budget, cfg):
    fast = decode(members, prompt, cfg, stop=stop, max_new_tokens=budget, trace=True)
    slow_text, rounds, slow_ids = slow_sweetspan(members, prompt, cfg, stop, budget)
    assert fast.text == slow_text
    assert fast.ids == slow_ids
    assert len(fast.trace.steps) == len(rounds) == fast.stats.rounds
    for r, (pool, fused, winner) in zip(fast.trace.steps, rounds):
        assert [(c.text, c.eos, c.proposers) for c in r.candidates] == [(c.text, c.eos, c.proposers) for c in pool]
        assert r.winner == winner
        for fc, rc, f in zip(r.candidates, pool, fused):
            assert_scores_match(fc.scores, rc.scores)
            assert fc.score == pytest.approx(f, rel=1e-4, abs=1e-4)
    assert fast.stats.words_per_round == [r.candidates[r.winner].words for r in fast.trace.steps]
    return fast
