"""`method=llm_blender`: LLM-Blender's rank-and-select (Jiang, Ren, Lin, ACL 2023), sample level.

Research notes: ../shared/research/baselines.md §1. Every member decodes its whole answer greedily,
exactly as `method=single` does; a ranker then picks one answer, which is the output. GenFuser (the
optional seq2seq fusion of the top answers) is not implemented: its 128-token limits rule it out for
GSM8K, and earlier token-level ensemble papers report LLM-Blender as rank-and-select (§1.2).

Rankers (`ranker=`):

- `nll` (default, no extra weights): every member scores every distinct answer by its mean token NLL
  given the prompt, in its own tokenisation (its own generated ids for its own answer; the seam's
  alignment for the others, as AdaFuse scores foreign words); an answer's score is the mean over
  members, the lowest wins, ties go to the lower member index. It is the default because PairRM's
  weights are a hub download that an offline machine does not have, and a default that silently
  changed with the contents of a cache would make two runs of one command disagree.
- `pairrm`: upstream's PairRM (`llm-blender/PairRM`, DeBERTa-v3-large, 0.4B; baselines/pairrm.py),
  from the hub or from a local directory (`pairrm_path`): every ordered pair of distinct answers
  compared, in both orders; the highest score wins, ties to the lower member index. Upstream's cheap
  "bubble" mode visits the answers in a random order; only the deterministic full matrix is offered.

Identical answers need no ranking: when all members agree, member 0's answer is returned without
scoring (every ranker would tie them, and ties go to the lower index).
"""

import math
from dataclasses import dataclass, field

from adafuse.config import SingleConfig
from adafuse.errors import NumericsError, UnknownNameError
from adafuse.member.context import Context
from adafuse.member.member import Member
from adafuse.member.passes import together
from adafuse.methods import Method, greedy
from adafuse.methods.session import Session
from adafuse.trace import Score
from baselines.pairrm import check_pairrm_path, pairrm

RANKERS = ("nll", "pairrm")


@dataclass
class LLMBlenderConfig:
    """Knobs of `method=llm_blender`."""

    ranker: str = "nll"  # nll: the members' mean NLL of each answer; pairrm: upstream's PairRM
    pairrm_path: str = "llm-blender/PairRM"  # a hub id or a local directory (ranker=pairrm only)

    def __post_init__(self):
        if self.ranker not in RANKERS:
            raise UnknownNameError("ranker", self.ranker, RANKERS)
        if self.ranker == "pairrm":
            check_pairrm_path(self.pairrm_path)


@dataclass
class Ranking:
    """What `trace=true` records of the one sample-level step."""

    ranker: str
    answers: list[str]  # per member: its greedy answer (method=single's output)
    candidates: list[str]  # the distinct answers, in member order
    scores: list[float]  # per candidate: nll, lower is better (inf: empty); pairrm, higher is better
    chosen: int  # the member whose answer is the output
    nll: list[list[Score]] = field(default_factory=list)  # ranker=nll: per member, per candidate
    matrix: list[list[float]] = field(default_factory=list)  # ranker=pairrm: C[i][j] over candidates


def positions_needed(cfg: LLMBlenderConfig, max_new_tokens: int) -> int:
    """Each member's greedy answer; ranker=nll then reads every answer after the prompt, re-encoded as
    text, which room for twice the budget covers (re-tokenised text is rarely longer than the ids)."""
    return 2 * max_new_tokens if cfg.ranker == "nll" else max_new_tokens


def decode(s: Session, cfg: LLMBlenderConfig):
    """Every member's greedy answer, and the one the ranker picks (a program)."""
    members, prompt = s.members, s.request.prompt
    after_prompt = [m.context.snapshot() for m in members]  # where ranker=nll scores the answers
    # Each answer is exactly method=single's output: the seam started every member on the raw
    # distribution (`raw_distribution`), and each decodes alone from there, all in the same engine steps.
    solos = [s.solo(k) for k in range(len(members))]
    yield from together([greedy.decode(alone, SingleConfig(0)) for alone in solos])
    answers = [alone.finish() for alone in solos]
    texts = [a.text for a in answers]
    candidates = list(dict.fromkeys(texts))  # distinct, in member order
    ranking = Ranking(cfg.ranker, texts, candidates, [0.0] * len(candidates), 0)
    if len(candidates) > 1:
        if cfg.ranker == "nll":
            ranking.scores, ranking.nll = yield from rank_by_nll(members, after_prompt, candidates)
            best = min(range(len(candidates)), key=ranking.scores.__getitem__)  # ties: the lower member
        else:
            ranker = pairrm(cfg.pairrm_path, members[0].device)
            ranking.scores, matrix = ranker.scores(prompt, candidates)
            ranking.matrix = matrix.tolist()
            best = max(range(len(candidates)), key=ranking.scores.__getitem__)
        ranking.chosen = texts.index(candidates[best])
    chosen = answers[ranking.chosen]
    s.append(chosen.text)  # one round; it holds no stop string (greedy decoding cut it before one)
    s.end(chosen.stats.stop_reason)
    s.set_output_ids([a.ids[0] for a in answers])
    s.note(ranker=cfg.ranker, ranked=len(candidates) > 1, chosen=ranking.chosen)
    s.log(ranking)  # the trace's prompt ids are the answers' own: each member started once, on the prompt


def rank_by_nll(members: list[Member], after_prompt: list[Context], candidates: list[str]):
    """Each candidate's mean over members of its mean token NLL given the prompt (an empty answer: inf), and
    each member's Scores (a program: every member's read in the same engine step).

    Each member goes back to its context after the prompt (`after_prompt`, its snapshots, its distribution
    there with control tokens masked as for every score, spec §2) and reads all candidates as its tokenizer
    encodes them after the prompt, in one batched pass (`Member.align`, `Member.read`): its own answer
    too, so every answer is scored on its text alone, whatever ids produced it and however it ended (eos,
    stop string, budget).
    """
    readable = [i for i, text in enumerate(candidates) if text]
    per_member: list[list[Score]] = [[Score(0, [], False, math.inf) for _ in candidates] for _ in members]
    if len(readable) > 1:  # a lone non-empty answer wins without reading
        for m, snapshot in zip(members, after_prompt):
            m.back_to_prompt(snapshot, mask_control=True)
        readings = yield from together([m.read([m.align("", candidates[i]) for i in readable]) for m in members])
    for k, (m, scores) in enumerate(zip(members, per_member)):
        if len(readable) > 1:
            for i, reading in zip(readable, readings[k]):
                a = reading.alignment
                if not reading.logprobs:
                    raise AssertionError(f"model {m.name!r} has no tokens to score for answer {candidates[i]!r}")
                nll = -sum(reading.logprobs) / len(reading.logprobs)
                if not math.isfinite(nll):
                    raise NumericsError(f"model {m.name!r}: the NLL of the answer {candidates[i]!r} is {nll}")
                scores[i] = Score(a.base, a.ids, False, nll, skip=a.skip)
        elif readable:
            scores[readable[0]].nll = 0.0
    fused = [sum(s[i].nll for s in per_member) / len(members) for i in range(len(candidates))]
    return fused, per_member


METHOD = Method(LLMBlenderConfig, decode, positions_needed, raw_distribution=True)
