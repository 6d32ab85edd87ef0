"""The comparisons of a fast decode with its oracle that several test files make: a member's scored
spans against the reference's, and AdaFuse's rounds against the cache-free reference (oracles/reference.py):
identical text, ids, pools (text, eos, proposers) and winners, NLLs and fused scores within 1e-4."""

import pytest

from adafuse import AdaFuseConfig, Generation, Request
from adafuse.engine.loop import drive
from adafuse.methods.adafuse import decode as adafuse_decode
from adafuse.methods.adafuse import positions_needed
from adafuse.methods.session import Session
from oracles import reference
from oracles.fast import decode


def assert_scores_match(fast_scores, slow_scores) -> None:
    """A fast Score list equals the reference's (base, ids, skip, nll) tuples; NLLs within 1e-4."""
    assert len(fast_scores) == len(slow_scores)
    for fs, (base, ids, skip, value) in zip(fast_scores, slow_scores):
        assert (fs.base, fs.ids, fs.skip) == (base, ids, skip)
        assert fs.nll == pytest.approx(value, abs=1e-4)


def assert_adafuse_agrees(members, prompt, stop, budget, cfg, early_finish: bool = True):
    """The fast decode of `prompt` equals the reference's, round by round, early finish included (or, with
    `early_finish=False`, both complete and score every round); returns the fast Generation."""
    if early_finish:
        fast = decode(members, prompt, cfg, stop=stop, max_new_tokens=budget, trace=True)
    else:
        fast = decode_in_full(members, Request(prompt, stop, budget, trace=True), cfg)
    slow = reference.generate(members, Request(prompt, stop, budget), cfg, early_finish=early_finish)
    assert fast.text == slow.text
    assert fast.ids == slow.ids
    assert fast.stats.early_finish == slow.early_finish
    assert len(fast.trace.rounds) == len(slow.rounds)
    for r, (pool, winner) in zip(fast.trace.rounds, slow.rounds):
        assert [(c.text, c.eos, c.proposers) for c in r.candidates] == [(c.text, c.eos, c.proposers) for c in pool]
        assert r.winner == winner
        for fc, rc in zip(r.candidates, pool):
            assert_scores_match(fc.scores, rc.scores)
            assert fc.fused == pytest.approx(rc.fused, abs=1e-4)
    return fast


def exercised(gen) -> tuple[int, int, int]:
    """(rounds, rounds won by a candidate some member did not propose and then continued, cut-backs)."""
    foreign = cut_backs = 0
    last = len(gen.trace.rounds) - 1
    for i, (contexts, rnd) in enumerate(zip(gen.trace.contexts(), gen.trace.rounds)):
        won = rnd.candidates[rnd.winner]
        foreign += i < last and len(won.proposers) < len(contexts)
        cut_backs += sum(s.base < len(contexts[k]) for c in rnd.candidates for k, s in enumerate(c.scores))
    return len(gen.trace.rounds), foreign, cut_backs


def decode_in_full(members, request: Request, cfg: AdaFuseConfig) -> Generation:
    """AdaFuse with every round completed and scored, even one whose outcome is settled early."""
    session = Session(members, request, reserve=positions_needed(cfg, request.max_new_tokens))

    def in_full():
        yield from session.start()
        yield from adafuse_decode(session, cfg, early_finish=False)

    drive(in_full())
    return session.finish()
