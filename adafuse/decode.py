"""AdaFuse decoding, exactly as ../shared/spec/adafuse.md specifies it (§3 round, §4 pool and scores, §5 stops).

Per round every model proposes candidates from the shared text: it commits words while the margin
p1 - p2 of its next-token distribution is at least `tau` (up to `max_words`), and at the first
uncertain word it branches into the `branches` best first tokens, each completed greedily into a
word. All models score every candidate by mean token NLL; the lowest mean over models wins and is
appended verbatim.

A model scores a candidate it did not propose as its tokenizer encodes the candidate in context
(`Member.align`): encode (prompt + G + candidate) as text and keep the longest common prefix with
the model's context ids. Where the boundary re-tokenises, the context is cut back to that prefix,
but never before the start of the last committed word; where the full encoding departs earlier (the
context holds the model's own non-canonical ids, or a chat template's control tokens), the text from
that word on plus the candidate is encoded by itself after it. The score averages only the tokens
that carry the candidate's text: tokens wholly before its first character are re-read, not counted.

Cost: every token a model proposes is read once (branches as one batch), the foreign candidates a
model scores are read in one batched forward pass, and committing reads nothing: the winner's KV
is already in the row that proposed or scored it (see `Member.commit`).
"""

import functools
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import torch

from adafuse.cache import Rows
from adafuse.config import AdaFuseConfig
from adafuse.errors import NumericsError
from adafuse.methods import Method
from adafuse.model import Member
from adafuse.session import Session
from adafuse.stopping import settled_cut
from adafuse.trace import CandidateTrace, ModelRound, RoundTrace, Score
from adafuse.words import CHAR_SLACK, ends_inside_char, is_word_complete


@dataclass
class Word:
    ids: list[int]
    logprobs: list[float]  # log p of each id in context
    text: str
    eos: bool  # the model's next token after the word is end-of-sequence
    next_logprobs: torch.Tensor  # the distribution after the word
    cut: bool = False  # cut back to a character boundary at the token cap: its row cannot be extended


@dataclass
class Proposal:
    """One model's candidate, with the fork row that holds its tokens (so committing it reads nothing)."""

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
    proposals: dict[int, Proposal] = field(default_factory=dict)  # model index -> its own proposal
    scores: list[Score] = field(default_factory=list)
    homes: list[tuple[Rows, int]] = field(default_factory=list)  # per model: the fork row holding its ids

    @property
    def proposers(self) -> list[int]:
        return list(self.proposals)


def decode(s: Session, cfg: AdaFuseConfig, early_finish: bool = True) -> None:
    """Decode the session's request with its members (K >= 1), round after round (spec §3-§5).

    `early_finish`: a round whose candidates all stop at the same text ends as soon as that is known
    (`RoundEnd`), without completing or scoring its words; the text is the one the full round gives.
    """
    while not s.done:
        round_idx = s.rounds
        ending = RoundEnd(s.text, s.stop) if early_finish and s.stop else None
        proposed = propose_all(s.members, cfg, round_idx, ending, s.concurrently)
        if ending is not None and ending.settled:
            s.end_early(ending.target)
            break
        proposals, model_rounds = zip(*proposed)
        pool = build_pool(proposals)
        scored = s.concurrently([functools.partial(scores_of, m, k, pool, round_idx) for k, m in enumerate(s.members)])
        for model_scores in scored:  # appended in model order, however the models ran
            for c, (score, home) in zip(pool, model_scores):
                c.scores.append(score)
                c.homes.append(home)
        fused = [sum(sc.nll for sc in c.scores) / len(s.members) for c in pool]
        winner = choose_winner(fused)
        if s.tracing:
            s.log_round(_round_trace(round_idx, model_rounds, pool, fused, winner))
        commit_winner(s.members, s, pool[winner])


class RoundEnd:
    """Whether a round's outcome is settled before its candidates are complete: every candidate, appended
    to G, reaches a stop string and is cut at the same point (spec §5), so whichever one would win, G
    ends as `target`.

    Candidates report as soon as their text settles the cut (`stopping.settled_cut`): before each step of a
    word's completion (`completing_words`), a model's proposal says whether it settles (`propose_all`).
    One candidate that ends without a stop, or at another point, makes the round run in full: the
    proposals then end exactly as they would have without the early finish.
    """

    def __init__(self, text: str, stop: tuple[str, ...]):
        self.text, self.stop = text, stop
        self.possible = True  # no candidate known so far rules an early finish out
        self.target: str | None = None  # the text every candidate known so far is cut to

    @property
    def settled(self) -> bool:
        return self.possible and self.target is not None

    def fresh(self) -> "RoundEnd":
        """A RoundEnd of the same round that knows no candidate yet."""
        return RoundEnd(self.text, self.stop)

    def cut(self, candidate: str, final: bool) -> str | None:
        """The text G ends as with this candidate (a complete one if `final`, else a prefix of one), if settled."""
        return settled_cut(self.text, candidate, self.stop, final)

    def agree(self, cuts: list[str | None]) -> bool:
        """Do these candidates' cuts settle where every one before them does? If not, no early finish."""
        target = cuts[0] if self.target is None and cuts else self.target
        if self.possible and cuts and all(cut is not None and cut == target for cut in cuts):
            self.target = target
        else:
            self.possible = False
        return self.possible


def propose_all(
    members: list[Member],
    cfg: AdaFuseConfig,
    round_idx: int,
    ending: RoundEnd | None,
    together: Callable[[list[Callable[[], object]]], list] = lambda tasks: [task() for task in tasks],
) -> list:
    """Every model's (proposals, ModelRound). `together` runs one task per model and returns their results
    (`Session.concurrently`: side by side in a batched run, so the models' passes meet in the same turns).

    With `ending`, the models step together, one forward pass each per step, while the round may still end
    early. Before each step every model says whether the text of every candidate it can still make settles
    (its own `RoundEnd`, so that no model's steps depend on how far another has got). When all that are
    still proposing settle, and their cuts agree with those of the ones that have ended, `ending.settled`,
    and an unfinished model's entry is None: its proposal is dropped. A model that has settled while
    another has not steps on meanwhile, as it would have unsettled: if the round does not end early, its
    proposal is already further on, not waiting to be finished after the others' (a turn per step)."""
    if ending is None:
        return together([functools.partial(finish, proposing(m, cfg, round_idx, None)) for m in members])
    own_endings = [ending.fresh() for _ in members]
    steps = [proposing(m, cfg, round_idx, own) for m, own in zip(members, own_endings)]
    results: list = [None] * len(members)
    running = list(range(len(members)))
    while running and all(own_endings[k].possible for k in running):
        settled = []
        for k, (ended, value) in zip(running, together([functools.partial(advance, steps[k]) for k in running])):
            if ended:
                results[k] = value
            else:
                settled.append(value)
        running = [k for k in running if results[k] is None]
        if running and all(settled):
            _agree(ending, own_endings, results)
            if ending.settled:
                return results
            break
    for k, result in zip(running, together([functools.partial(finish, steps[k]) for k in running])):
        results[k] = result
    if not running:  # every model ended within the steps: their candidates may still all settle
        _agree(ending, own_endings, results)
    return results


def _agree(ending: RoundEnd, own_endings: list[RoundEnd], results: list) -> None:
    """Settle `ending` on every model's candidates, in model order: the cut its own ending settled on for a
    model still proposing, the cuts of its candidates for one that has ended."""
    for own, result in zip(own_endings, results):
        ending.agree([own.target] if result is None else [ending.cut(p.text, final=True) for p in result[0]])


def advance(steps: Generator) -> tuple[bool, object]:
    """Run a proposal on to the point before its next step: (False, whether it settles there), or
    (True, its result) if it has ended."""
    try:
        return False, next(steps)
    except StopIteration as done:
        return True, done.value


def finish(steps: Generator):
    """Run a proposal to its end, past every point where it says whether it settles: its result."""
    while True:
        ended, value = advance(steps)
        if ended:
            return value


def positions_needed(cfg: AdaFuseConfig, max_new_tokens: int) -> int:
    """Context positions decoding may use after the prompt: the budget, overrun by at most one round."""
    return max_new_tokens + (cfg.fixed_words or cfg.max_words) * (cfg.max_word_tokens + CHAR_SLACK)


# ---- one model's proposal (spec §3) --------------------------------------------------------------


def margin(logprobs: torch.Tensor) -> float:
    """Δ = p1 - p2 on the softmax of the raw logits (control tokens removed, spec §2)."""
    top = logprobs.topk(2).values.exp()
    return (top[0] - top[1]).item()


def propose(m: Member, cfg: AdaFuseConfig, round_idx: int = 0) -> tuple[list[Proposal], ModelRound]:
    """One model's candidates for this round, and the trace of its margins and committed words."""
    return finish(proposing(m, cfg, round_idx, None))


def proposing(
    m: Member, cfg: AdaFuseConfig, round_idx: int, ending: RoundEnd | None
) -> Generator[bool, None, tuple[list[Proposal], ModelRound]]:
    """`propose`, yielding before each step of its words' completion (`completing_words`), with `ending`:
    whether the text of every candidate it can still make settles `ending` there."""
    adaptive = cfg.fixed_words is None  # the ablation commits fixed_words greedy words, no confidence test
    rows = m.fork(1)
    logprobs, words, margins = m.logprobs, [], []
    for _ in range(cfg.max_words if adaptive else cfg.fixed_words):
        if adaptive:
            margins.append(margin(logprobs))
            if math.isnan(margins[-1]):  # NaN < tau is False: it would count as confident
                raise NumericsError(f"model {m.name!r}: the margin is NaN in round {round_idx} (non-finite logits)")
            if margins[-1] < cfg.tau:  # an uncertain word: explore it, and end the round
                branches = yield from exploring(m, rows, words, logprobs, cfg, ending)
                round_ = ModelRound(margins, [w.text for w in words], branched=True)
                return [Proposal(words + [w], r, i) for w, (r, i) in branches], round_
        first = [m.tokens.choose(logprobs)]
        # every candidate of this model goes on from this word: its text settling is theirs settling
        (word,) = yield from completing_words(m, rows, first, logprobs, words, cfg.max_word_tokens, ending, False)
        words.append(word)
        if word.eos or word.cut:
            break
        logprobs = word.next_logprobs
    return [Proposal(words, rows, 0)], ModelRound(margins, [w.text for w in words], branched=False)


def explore(m: Member, rows: Rows, words: list[Word], logprobs: torch.Tensor, cfg: AdaFuseConfig):
    """The uncertain word's alternatives: [(word, (rows, row))], best first."""
    return finish(exploring(m, rows, words, logprobs, cfg, None))


def exploring(m: Member, rows: Rows, words: list[Word], logprobs: torch.Tensor, cfg: AdaFuseConfig, ending):
    """`explore`, yielding before each step whether every branch's text settles `ending` (not the beam
    search: it ranks whole words)."""
    if cfg.diversity or cfg.branches == 1:
        # distinct first tokens, by probability, each one that can start a character
        firsts = m.tokens.restrict(logprobs).topk(cfg.branches).indices.tolist()
        fork = rows.fork(0, len(firsts))
        completed = yield from completing_words(m, fork, firsts, logprobs, words, cfg.max_word_tokens, ending, True)
        return [(w, (fork, i)) for i, w in enumerate(completed)]
    return beam_words(m, rows, words, logprobs, cfg)


def complete_words(
    m: Member, rows: Rows, firsts: list[int], logprobs: torch.Tensor, before: list[Word], max_tokens: int
) -> list[Word]:
    """Complete each first token greedily into a word (spec §2), row i of `rows` taking firsts[i].

    The rows are read as one batch, one token per step, until every row has a complete word.
    `before` holds the words already committed in this round (the context ends after them).
    A word is cut at `max_tokens` tokens; one that ends inside a character there runs on for up to
    `CHAR_SLACK` tokens to finish it, and is cut back to its last character boundary if it cannot.
    """
    return finish(completing_words(m, rows, firsts, logprobs, before, max_tokens, None, False))


def completing_words(
    m: Member,
    rows: Rows,
    firsts: list[int],
    logprobs: torch.Tensor,
    before: list[Word],
    max_tokens: int,
    ending: RoundEnd | None,
    last: bool,
) -> Generator[bool, None, list[Word]]:
    """`complete_words`, yielding before each step, with `ending`: whether every row still growing has text
    that settles `ending`, and so do the rows already complete if their words end candidates (`last`).
    Yields change nothing in the steps: run on after any of them, the words are the ones it would make."""
    context = m.ids + [i for w in before for i in w.ids]
    committed = "".join(w.text for w in before)
    words: list[Word | None] = [None] * len(firsts)
    ids = [[t] for t in firsts]
    lps = [[logprobs[t].item()] for t in firsts]
    dists: list[list[torch.Tensor]] = [[] for _ in firsts]  # dists[i][j]: the distribution after ids[i][: j + 1]
    feed = [[t] for t in firsts]
    texts: list[str] = [""] * len(firsts)  # texts[i]: the text of ids[i], its last token not read yet
    for i, t in enumerate(firsts):
        if t in m.eos_ids:  # end-of-sequence as the first token: the empty word, flagged eos
            words[i], feed[i] = Word([], [], "", True, logprobs), []
    while any(feed):
        for i, fed in enumerate(feed):
            if fed:
                texts[i] = m.text_of(ids[i], context)
        if ending is not None and ending.possible:
            # text that ends inside a character is not a prefix of the word's text: that character will change
            growing = [
                None if ends_inside_char(texts[i]) else ending.cut(committed + texts[i], False)
                for i, fed in enumerate(feed)
                if fed
            ]
            complete = [ending.cut(committed + w.text, True) for w in words if w is not None] if last else []
            yield None not in growing and ending.agree(growing + complete)
        elif ending is not None:
            yield False
        step = rows.extend(feed)
        for i, fed in enumerate(feed):
            if not fed:
                continue
            dist = step[i, 0]
            dists[i].append(dist)
            nxt = m.tokens.choose(dist, m.tokens.pending(ids[i]))
            text = texts[i]
            at_eos = nxt in m.eos_ids
            next_text = None if at_eos or ends_inside_char(text) else m.text_of([nxt], context + ids[i])
            capped = len(ids[i]) >= max_tokens and not ends_inside_char(text)
            if capped or is_word_complete(text, next_text, at_eos):
                words[i], feed[i] = Word(ids[i], lps[i], text, at_eos, dist), []
            elif len(ids[i]) >= max_tokens + CHAR_SLACK:
                word = Word(ids[i], lps[i], text, False, dist)
                words[i], feed[i] = cut_to_char(m, rows, i, word, dists[i], context), []
            else:
                ids[i].append(nxt)
                lps[i].append(dist[nxt].item())
                feed[i] = [nxt]
    return words


def cut_to_char(m: Member, rows: Rows, row: int, word: Word, dists: list[torch.Tensor], context: list[int]) -> Word:
    """`word` (row `row` of `rows`) cut back to its longest prefix that ends on a character boundary.

    A word of bytes that form no character at all is kept whole: its replacement characters are not
    a partial character that a later token could complete.
    """
    for n in range(len(word.ids) - 1, 0, -1):
        text = m.text_of(word.ids[:n], context)
        if not ends_inside_char(text):
            rows.truncate(row, len(rows.tokens[row]) - (len(word.ids) - n), dists[n - 1])
            return Word(word.ids[:n], word.logprobs[:n], text, False, dists[n - 1], cut=True)
    return word


def beam_words(m: Member, rows: Rows, before: list[Word], logprobs: torch.Tensor, cfg: AdaFuseConfig):
    """`diversity=false`: the B best words of a token-level beam search of width B (the paper's Figure 7).

    A hypothesis ends where the word rule ends it: when the token it would be extended with starts
    with whitespace or is end-of-sequence (its score then includes that token's log-probability),
    or when its own text ends with whitespace. Scores are summed log-probabilities. Unlike the
    default, the B words may share their first token, which is the point of the comparison. The word
    cap is the default path's: `max_word_tokens`, run on to finish a character, else cut back.
    """
    B, context = cfg.branches, m.ids + [i for w in before for i in w.ids]
    beam = rows.fork(0, 1)
    live = [([], [], 0.0, [logprobs])]  # (ids, logprobs, score, distributions after each prefix), row i of `beam`
    finished = []  # (score, word, (rows, row))
    while live:
        expansions = []
        for h, (ids, _, score, dists) in enumerate(live):
            top = m.tokens.restrict(dists[-1], m.tokens.pending(ids)).topk(B)
            expansions += [(score + lp, h, t) for lp, t in zip(top.values.tolist(), top.indices.tolist())]
        expansions.sort(key=lambda e: -e[0])
        ended, grown = set(), []
        for total, h, t in expansions:
            ids, lps, score, dists = live[h]
            text = m.text_of(ids, context)
            at_eos = t in m.eos_ids
            boundary = at_eos or ids and is_word_complete(text, m.text_of([t], context + ids), False)
            if boundary and h not in ended:
                ended.add(h)
                finished.append((total, Word(ids, lps, text, at_eos, dists[-1]), (beam, h)))
            elif not boundary and len(grown) < B:
                grown.append((h, t, total))
        finished.sort(key=lambda f: -f[0])
        best_live = max((total for _, _, total in grown), default=float("-inf"))
        if not grown or len(finished) >= B and finished[B - 1][0] >= best_live:
            break
        beam = beam.select([h for h, _, _ in grown])
        step = beam.extend([[t] for _, t, _ in grown])
        live = [
            (live[h][0] + [t], live[h][1] + [live[h][3][-1][t].item()], total, live[h][3] + [step[i, 0]])
            for i, (h, t, total) in enumerate(grown)
        ]
        done = []
        for i, (ids, lps, total, dists) in enumerate(live):
            text = m.text_of(ids, context)
            # a hypothesis whose own text ends in whitespace is a complete word whatever comes next
            if is_word_complete(text, None, False) or len(ids) >= cfg.max_word_tokens and not ends_inside_char(text):
                finished.append((total, Word(ids, lps, text, False, dists[-1]), (beam, i)))
                done.append(i)
            elif len(ids) >= cfg.max_word_tokens + CHAR_SLACK:
                word = cut_to_char(m, beam, i, Word(ids, lps, text, False, dists[-1]), dists[1:], context)
                finished.append((sum(word.logprobs), word, (beam, i)))
                done.append(i)
        if done:
            keep = [i for i in range(len(live)) if i not in done]
            beam, live = beam.select(keep), [live[i] for i in keep]
    finished.sort(key=lambda f: -f[0])
    return [(word, home) for _, word, home in finished[:B]]


# ---- pool, scores, choice (spec §4) --------------------------------------------------------------


def build_pool(proposals) -> list[Candidate]:
    """The union of all proposals keyed by (text, eos), in first-insertion order: model, then branch rank."""
    pool: dict[tuple[str, bool], Candidate] = {}
    for k, props in enumerate(proposals):
        for p in props:
            c = pool.setdefault((p.text, p.eos), Candidate(p.text, p.eos, len(p.words)))
            c.proposals.setdefault(k, p)  # a model's own duplicate keeps its higher-ranked ids
    return list(pool.values())


def commit_winner(members: list[Member], s: Session, best: Candidate) -> None:
    """Every model takes the winning candidate from the row that proposed or scored it (nothing is
    read again), and the shared text grows by it."""
    for k, m in enumerate(members):
        m.commit(*best.homes[k], best.text)
        m.check_invariant()
    s.add(best.text, eos=best.eos, words=best.words)


def choose_winner(fused: list[float]) -> int:
    """Index of the lowest fused score; ties go to the earliest candidate in pool order."""
    return min(range(len(fused)), key=fused.__getitem__)


def score_candidates(m: Member, k: int, pool: list[Candidate], round_idx: int = 0) -> None:
    """Append model k's Score (and where the scored ids are cached) to every candidate (`scores_of`)."""
    for c, (score, home) in zip(pool, scores_of(m, k, pool, round_idx)):
        c.scores.append(score)
        c.homes.append(home)


def scores_of(m: Member, k: int, pool: list[Candidate], round_idx: int = 0) -> list[tuple[Score, tuple[Rows, int]]]:
    """Model k's Score of every candidate, with the fork row that holds the scored ids.

    Its own candidates are scored on the ids it generated; the others as it encodes them in
    context, all in one batched forward pass (`Member.align`, `Member.read`).
    """
    foreign = [c for c in pool if k not in c.proposals]
    readings = iter(m.read([m.align(c.text) for c in foreign]) if foreign else ())
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


def _round_trace(round_idx: int, model_rounds, pool: list[Candidate], fused: list[float], winner: int) -> RoundTrace:
    candidates = [CandidateTrace(c.text, c.eos, c.proposers, c.words, c.scores, f) for c, f in zip(pool, fused)]
    return RoundTrace(round_idx, list(model_rounds), candidates, winner)


METHOD = Method(AdaFuseConfig, decode, positions_needed)
