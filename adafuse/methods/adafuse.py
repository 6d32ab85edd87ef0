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

import math

import torch

from adafuse.config import AdaFuseConfig
from adafuse.errors import NumericsError
from adafuse.member.context import Rows
from adafuse.member.passes import together
from adafuse.methods import Method
from adafuse.methods.completion import Settles, Word, complete_words, cut_to_char
from adafuse.methods.pool import Candidate, Proposal, build_pool, choose_winner, commit, score_pool
from adafuse.methods.session import Session
from adafuse.methods.stopping import settled_cut
from adafuse.text.top import top_two
from adafuse.text.words import CHAR_SLACK, ends_inside_char, is_word_complete
from adafuse.trace import CandidateTrace, ModelRound, RoundTrace


def decode(s: Session, cfg: AdaFuseConfig, early_finish: bool = True):
    """Decode the session's request with its members (K >= 1), round after round (spec §3-§5): a program.

    `early_finish`: a round whose candidates all stop at the same text ends as soon as that is known
    (`RoundEnd`), without completing or scoring its words; the text is the one the full round gives.
    """
    while not s.done:
        yield from one_round(s, cfg, early_finish)


def one_round(s: Session, cfg: AdaFuseConfig, early_finish: bool):
    """One round (spec §3-§4): proposals, the pool, every member's scores, the winner committed (a program). Its
    forks (proposals, branches, candidates read) end with it: none outlives the commit, nor the KV it reads."""
    round_idx = s.rounds
    ending = RoundEnd(s.text, s.stop) if early_finish and s.stop else None
    proposed = yield from propose_all(s.members, cfg, round_idx, ending)
    if ending is not None and ending.settled:
        s.end_early(ending.target)
        return
    proposals, model_rounds = zip(*proposed)
    pool = build_pool(list(proposals))
    yield from score_pool(s.members, s.text, pool, round_idx)
    fused = [sum(sc.nll for sc in c.scores) / len(s.members) for c in pool]
    winner = choose_winner(fused)
    if s.tracing:
        s.log_round(_round_trace(round_idx, model_rounds, pool, fused, winner))
    commit(s, pool[winner])


class RoundEnd:
    """Whether a round's outcome is settled before its candidates are complete: every candidate, appended
    to G, reaches a stop string and is cut at the same point (spec §5), so whichever one would win, G
    ends as `target`.

    Candidates report as soon as their text settles the cut (`stopping.settled_cut`): before each step of a
    word's completion (adafuse/methods/completion.py `complete_words`), a model's proposal says whether it settles
    (a `Settles`, read by `propose_all`).
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


def propose_all(members: list, cfg: AdaFuseConfig, round_idx: int, ending: "RoundEnd | None"):
    """Every model's (proposals, ModelRound), each model's passes in the same engine steps (a program).

    With `ending`, the models step together, one forward pass each per step, while the round may still end
    early. Before each step every model says whether the text of every candidate it can still make settles
    (its own `RoundEnd`, so that no model's steps depend on how far another has got). When all that are
    still proposing settle, and their cuts agree with those of the ones that have ended, `ending.settled`,
    and an unfinished model's entry is None: its proposal is dropped. A model that has settled while
    another has not steps on meanwhile, as it would have unsettled: if the round does not end early, its
    proposal is already further on, not waiting to be finished after the others' (a step per pass)."""
    if ending is None:
        return (yield from together([finish(proposing(m, cfg, round_idx, None)) for m in members]))
    own_endings = [ending.fresh() for _ in members]
    steps = [proposing(m, cfg, round_idx, own) for m, own in zip(members, own_endings)]
    results: list = [None] * len(members)
    running = list(range(len(members)))
    while running and all(own_endings[k].possible for k in running):
        settled = []
        for k, (ended, value) in zip(running, (yield from together([advance(steps[k]) for k in running]))):
            if ended:
                results[k] = value
            else:
                settled.append(value)
        running = [k for k in running if results[k] is None]
        if running and all(settled):
            _agree(ending, own_endings, results)
            if ending.settled:
                for k in running:
                    steps[k].close()
                return results
            break
    for k, result in zip(running, (yield from together([finish(steps[k]) for k in running]))):
        results[k] = result
    if not running:  # every model ended within the steps: their candidates may still all settle
        _agree(ending, own_endings, results)
    return results


def _agree(ending: "RoundEnd", own_endings: list["RoundEnd"], results: list) -> None:
    """Settle `ending` on every model's candidates, in model order: the cut its own ending settled on for a
    model still proposing, the cuts of its candidates for one that has ended."""
    for own, result in zip(own_endings, results):
        ending.agree([own.target] if result is None else [ending.cut(p.text, final=True) for p in result[0]])


def advance(steps):
    """Run a proposal on to the point before its next step, its passes yielded (a program): (False, whether it
    settles there), or (True, its result) if it has ended."""
    value = None
    while True:
        try:
            asked = steps.send(value)
        except StopIteration as done:
            return True, done.value
        if isinstance(asked, Settles):
            return False, asked.settled
        value = yield asked


def finish(steps):
    """Run a proposal to its end, past every point where it says whether it settles (a program): its result."""
    while True:
        ended, value = yield from advance(steps)
        if ended:
            return value


def positions_needed(cfg: AdaFuseConfig, max_new_tokens: int) -> int:
    """Context positions decoding may use after the prompt: the budget, overrun by at most one round."""
    return max_new_tokens + (cfg.fixed_words or cfg.max_words) * (cfg.max_word_tokens + CHAR_SLACK)


# ---- one model's proposal (spec §3) --------------------------------------------------------------


def margin(logprobs: torch.Tensor) -> float:
    """Δ = p1 - p2 on the softmax of the raw logits (control tokens removed, spec §2)."""
    top = top_two(logprobs).exp()
    return (top[0] - top[1]).item()


def proposing(m, cfg: AdaFuseConfig, round_idx: int, ending: "RoundEnd | None"):
    """One model's candidates for this round, and the trace of its margins and committed words (a program).
    With `ending`, it yields a `Settles` before each step of its words' completion: whether the text of every
    candidate it can still make settles `ending` there."""
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
        first = [m.tokenisation.tokens.choose(logprobs)]
        # every candidate of this model goes on from this word: its text settling is theirs settling
        (word,) = yield from complete_words(m, rows, first, logprobs, words, cfg.max_word_tokens, ending, False)
        words.append(word)
        if word.eos or word.cut:
            break
        logprobs = word.next_logprobs
    return [Proposal(words, rows, 0)], ModelRound(margins, [w.text for w in words], branched=False)


def exploring(m, rows: Rows, words: list[Word], logprobs: torch.Tensor, cfg: AdaFuseConfig, ending):
    """The uncertain word's alternatives, [(word, (rows, row))], best first (a program); with `ending`, a
    `Settles` before each step: whether every branch's text settles it (not the beam search: it ranks whole
    words)."""
    if cfg.diversity or cfg.branches == 1:
        # distinct first tokens, by probability, each one that can start a character
        firsts = m.tokenisation.tokens.restrict(logprobs).topk(cfg.branches).indices.tolist()
        fork = rows.fork(0, len(firsts))
        completed = yield from complete_words(m, fork, firsts, logprobs, words, cfg.max_word_tokens, ending, True)
        return [(w, (fork, i)) for i, w in enumerate(completed)]
    return (yield from beam_words(m, rows, words, logprobs, cfg))


def beam_words(m, rows: Rows, before: list[Word], logprobs: torch.Tensor, cfg: AdaFuseConfig):
    """`diversity=false`: the B best words of a token-level beam search of width B (the paper's Figure 7),
    [(word, (rows, row))], best first (a program).

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
            top = m.tokenisation.tokens.restrict(dists[-1], m.tokenisation.tokens.pending(ids)).topk(B)
            expansions += [(score + lp, h, t) for lp, t in zip(top.values.tolist(), top.indices.tolist())]
        expansions.sort(key=lambda e: -e[0])
        ended, grown = set(), []
        for total, h, t in expansions:
            ids, lps, score, dists = live[h]
            text = m.text_of(ids, context)
            at_eos = t in m.tokenisation.eos_ids
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
        step = yield from beam.extend([[t] for _, t, _ in grown])
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


def _round_trace(round_idx: int, model_rounds, pool: list[Candidate], fused: list[float], winner: int) -> RoundTrace:
    candidates = [CandidateTrace(c.text, c.eos, c.proposers, c.words, c.scores, f) for c, f in zip(pool, fused)]
    return RoundTrace(round_idx, list(model_rounds), candidates, winner)


METHOD = Method(AdaFuseConfig, decode, positions_needed)
