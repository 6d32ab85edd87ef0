"""A pool of candidate texts, scored by every member and committed (spec §4), for every method that picks
among the members' proposals: AdaFuse (adafuse/methods/adafuse.py) and SweetSpan (baselines/sweetspan.py).

- `build_pool`: the union of the members' proposals keyed by (text, eos), in first-insertion order.
- `score_pool`: every member scores every candidate by its mean token NLL, in its own tokenisation: its own
  generated ids for a candidate it proposed, otherwise the candidate as its tokenizer encodes it in context
  (adafuse/text/align.py), all of a member's foreign candidates in one batched pass, every member in the same
  engine step. An eos candidate adds the member's most probable eos id.
- `commit`: every member takes the winner from the row that proposed or scored it (nothing is read again),
  and the generated text grows by it.
"""

import math
from dataclasses import dataclass, field

from adafuse.errors import NumericsError
from adafuse.member.context import Rows
from adafuse.member.passes import together
from adafuse.methods.completion import Word
from adafuse.trace import Score


@dataclass
class Proposal:
    """One member's candidate, with the fork row that holds its tokens (so committing it reads nothing)."""

    words: list[Word]
    rows: Rows
    row: int

    @property
    def text(self) -> str:
        return "".join(w.text for w in self.words)

    @property
    def ids(self) -> list[int]:
        return [i for w in self.words for i in w.ids]

    @property
    def eos(self) -> bool:
        return self.words[-1].eos


@dataclass
class Candidate:
    text: str
    eos: bool
    words: int
    proposals: dict[int, Proposal] = field(default_factory=dict)  # member index -> its own proposal
    scores: list[Score] = field(default_factory=list)  # per member, in member order (`score_pool`)
    homes: list[tuple[Rows, int]] = field(default_factory=list)  # per member: the fork row holding its ids

    @property
    def proposers(self) -> list[int]:
        return list(self.proposals)


def build_pool(proposals: list[list[Proposal]]) -> list[Candidate]:
    """The union of all proposals keyed by (text, eos), in first-insertion order: member, then branch rank."""
    pool: dict[tuple[str, bool], Candidate] = {}
    for k, props in enumerate(proposals):
        for p in props:
            c = pool.setdefault((p.text, p.eos), Candidate(p.text, p.eos, len(p.words)))
            c.proposals.setdefault(k, p)  # a member's own duplicate keeps its higher-ranked ids
    return list(pool.values())


def score_pool(members: list, generated: str, pool: list[Candidate], round_idx: int = 0):
    """Every member's Score of every candidate, appended to it with the row that holds the scored ids (a
    program: every member's pass in the same step). `generated` is the generated text G so far."""
    scored = yield from together([scores_of(m, k, generated, pool, round_idx) for k, m in enumerate(members)])
    for member_scores in scored:  # appended in member order
        for c, (score, home) in zip(pool, member_scores):
            c.scores.append(score)
            c.homes.append(home)


def scores_of(m, k: int, generated: str, pool: list[Candidate], round_idx: int = 0):
    """Member k's Score of every candidate, with the fork row that holds the scored ids (a program)."""
    foreign = [c for c in pool if k not in c.proposals]
    readings = iter((yield from m.read([m.align(generated, c.text) for c in foreign])) if foreign else ())
    scored = []
    for c in pool:
        if k in c.proposals:
            p = c.proposals[k]
            lps = [lp for w in p.words for lp in w.logprobs]
            after = p.words[-1].next_logprobs
            score, home = Score(len(m.ids), p.ids, p.eos, 0.0), (p.rows, p.row)
        else:
            reading = next(readings)
            lps, after, home = reading.logprobs, reading.after, reading.home
            a = reading.alignment
            score = Score(a.base, a.ids, c.eos, 0.0, skip=a.skip)
        if c.eos:
            lps = lps + [m.eos_logprob(after)]
        if not lps:
            raise AssertionError(f"model {m.name!r} has no tokens to score for candidate {c.text!r}")
        score.nll = -sum(lps) / len(lps)
        if not math.isfinite(score.nll):
            raise NumericsError(f"model {m.name!r}: the NLL of {c.text!r} is {score.nll} in round {round_idx}")
        scored.append((score, home))
    return scored


def choose_winner(fused: list[float]) -> int:
    """Index of the lowest fused score; ties go to the earliest candidate in pool order."""
    return min(range(len(fused)), key=fused.__getitem__)


def commit(s, best: Candidate) -> None:
    """Every member of session `s` takes the winning candidate from the row that proposed or scored it
    (nothing is read again), and the generated text grows by it."""
    for k, m in enumerate(s.members):
        m.commit(*best.homes[k], s.text, best.text)
        m.check_invariant()
    s.add(best.text, eos=best.eos, words=best.words)
