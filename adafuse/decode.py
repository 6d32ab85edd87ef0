"""AdaFuse decoding, exactly as ../shared/spec/adafuse.md specifies it (§3 round, §4 pool and scores, §5 stops).

Per round every model proposes candidates from the shared text: it commits words while the margin
p1 - p2 of its next-token distribution is at least `tau` (up to `max_words`), and at the first
uncertain word it branches into the `branches` best first tokens, each completed greedily into a
word. All models score every candidate by mean token NLL; the lowest mean over models wins and is
appended verbatim.

Cost: every token a model proposes is read once (branches as one batch), the foreign candidates a
model scores are read in one batched forward pass, and committing reads nothing: the winner's KV
is already in the row that proposed or scored it (see `Member.commit`).
"""

import time
from dataclasses import dataclass, field

import torch

from adafuse.config import AdaFuseConfig
from adafuse.errors import DataError
from adafuse.model import Member, Rows, common_prefix
from adafuse.trace import CandidateTrace, Generation, ModelRound, RoundTrace, Score, Stats, Trace
from adafuse.words import ends_inside_char, is_word_complete

# A word cut at max_word_tokens still runs on to finish a multi-byte character (at most 4 bytes).
_CHAR_SLACK = 4


@dataclass
class Word:
    ids: list[int]
    logprobs: list[float]  # log p of each id in context
    text: str
    eos: bool  # the model's next token after the word is end-of-sequence
    next_logprobs: torch.Tensor  # the distribution after the word


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


def generate(
    members: list[Member], prompt: str, cfg: AdaFuseConfig, *, stop=(), max_new_tokens: int = 64, trace: bool = False
) -> Generation:
    """Decode `prompt` with the ensemble `members` (K >= 1)."""
    started = time.perf_counter()
    for m in members:
        m.reset_counters()
        m.start(prompt, reserve=positions_needed(cfg, max_new_tokens))
    record = Trace(prompt_ids=[list(m.ids) for m in members]) if trace else None
    stats, text = Stats(), ""
    while not stats.stop_reason:
        proposals, model_rounds = zip(*(propose(m, cfg) for m in members))
        pool = build_pool(proposals)
        for k, m in enumerate(members):
            score_candidates(m, k, m.prompt_text + text, pool)
        fused = [sum(s.nll for s in c.scores) / len(members) for c in pool]
        winner = choose_winner(fused)
        best = pool[winner]
        for k, m in enumerate(members):
            m.commit(*best.homes[k])
            m.check_invariant()
        if record:
            record.rounds.append(_round_trace(stats.rounds, model_rounds, pool, fused, winner))
        stats.rounds += 1
        stats.words_per_round.append(best.words)
        text, stats.stop_reason = _stopped(text, best, stop, members, max_new_tokens)
    ids = [list(m.generated_ids) for m in members]
    stats.tokens_generated = [len(i) for i in ids]
    stats.tokens_fed = [m.tokens_fed for m in members]
    stats.forward_passes = [m.forward_passes for m in members]
    stats.seconds = time.perf_counter() - started
    return Generation(text=text, stats=stats, ids=ids, trace=record)


def positions_needed(cfg: AdaFuseConfig, max_new_tokens: int) -> int:
    """Context positions decoding may use after the prompt: the budget, overrun by at most one round."""
    return max_new_tokens + (cfg.fixed_words or cfg.max_words) * (cfg.max_word_tokens + _CHAR_SLACK)


# ---- one model's proposal (spec §3) --------------------------------------------------------------


def margin(logprobs: torch.Tensor) -> float:
    """Δ = p1 - p2 on the full-vocabulary softmax of the raw logits."""
    top = logprobs.topk(2).values.exp()
    return (top[0] - top[1]).item()


def propose(m: Member, cfg: AdaFuseConfig) -> tuple[list[Proposal], ModelRound]:
    """One model's candidates for this round, and the trace of its margins and committed words."""
    adaptive = cfg.fixed_words is None  # the ablation commits fixed_words greedy words, no confidence test
    rows = m.fork(1)
    logprobs, words, margins = m.logprobs, [], []
    for _ in range(cfg.max_words if adaptive else cfg.fixed_words):
        if adaptive:
            margins.append(margin(logprobs))
            if margins[-1] < cfg.tau:  # an uncertain word: explore it, and end the round
                branches = explore(m, rows, words, logprobs, cfg)
                round_ = ModelRound(margins, [w.text for w in words], branched=True)
                return [Proposal(words + [w], r, i) for w, (r, i) in branches], round_
        (word,) = complete_words(m, rows, [int(logprobs.argmax())], logprobs, words, cfg.max_word_tokens)
        words.append(word)
        if word.eos:
            break
        logprobs = word.next_logprobs
    return [Proposal(words, rows, 0)], ModelRound(margins, [w.text for w in words], branched=False)


def explore(m: Member, rows: Rows, words: list[Word], logprobs: torch.Tensor, cfg: AdaFuseConfig):
    """The uncertain word's alternatives: [(word, (rows, row))], best first."""
    if cfg.diversity or cfg.branches == 1:
        firsts = logprobs.topk(cfg.branches).indices.tolist()  # distinct first tokens, by probability
        fork = rows.fork(0, len(firsts))
        completed = complete_words(m, fork, firsts, logprobs, words, cfg.max_word_tokens)
        return [(w, (fork, i)) for i, w in enumerate(completed)]
    return beam_words(m, rows, words, logprobs, cfg)


def complete_words(
    m: Member, rows: Rows, firsts: list[int], logprobs: torch.Tensor, before: list[Word], max_tokens: int
) -> list[Word]:
    """Complete each first token greedily into a word (spec §2), row i of `rows` taking firsts[i].

    The rows are read as one batch, one token per step, until every row has a complete word.
    `before` holds the words already committed in this round (the context ends after them).
    """
    context = m.ids + [i for w in before for i in w.ids]
    words: list[Word | None] = [None] * len(firsts)
    ids = [[t] for t in firsts]
    lps = [[logprobs[t].item()] for t in firsts]
    feed = [[t] for t in firsts]
    for i, t in enumerate(firsts):
        if t in m.eos_ids:  # end-of-sequence as the first token: the empty word, flagged eos
            words[i], feed[i] = Word([], [], "", True, logprobs), []
    while any(feed):
        step = rows.extend(feed)
        for i, fed in enumerate(feed):
            if not fed:
                continue
            dist = step[i, 0]
            nxt = int(dist.argmax())
            text = m.text_of(ids[i], context)
            at_eos = nxt in m.eos_ids
            next_text = None if at_eos or ends_inside_char(text) else m.text_of([nxt], context + ids[i])
            cut = len(ids[i]) >= max_tokens and not ends_inside_char(text) or len(ids[i]) >= max_tokens + _CHAR_SLACK
            if cut or is_word_complete(text, next_text, at_eos):
                words[i], feed[i] = Word(ids[i], lps[i], text, at_eos, dist), []
            else:
                ids[i].append(nxt)
                lps[i].append(dist[nxt].item())
                feed[i] = [nxt]
    return words


def beam_words(m: Member, rows: Rows, before: list[Word], logprobs: torch.Tensor, cfg: AdaFuseConfig):
    """`diversity=false`: the B best words of a token-level beam search of width B (the paper's Figure 7).

    A hypothesis ends where the word rule ends it: when the token it would be extended with starts
    with whitespace or is end-of-sequence (its score then includes that token's log-probability),
    or when its own text ends with whitespace. Scores are summed log-probabilities. Unlike the
    default, the B words may share their first token, which is the point of the comparison.
    """
    B, context = cfg.branches, m.ids + [i for w in before for i in w.ids]
    beam = rows.fork(0, 1)
    live = [([], [], 0.0)]  # (ids, logprobs, score), row i of `beam`
    dists = [logprobs]
    finished = []  # (score, word, (rows, row))
    for _ in range(cfg.max_word_tokens + _CHAR_SLACK):
        expansions = []
        for h, (_, _, score) in enumerate(live):
            top = dists[h].topk(B)
            expansions += [(score + lp, h, t) for lp, t in zip(top.values.tolist(), top.indices.tolist())]
        expansions.sort(key=lambda e: -e[0])
        ended, grown = set(), []
        for total, h, t in expansions:
            ids, lps, score = live[h]
            text = m.text_of(ids, context)
            at_eos = t in m.eos_ids
            boundary = at_eos or ids and is_word_complete(text, m.text_of([t], context + ids), False)
            if boundary and h not in ended:
                ended.add(h)
                finished.append((total, Word(ids, lps, text, at_eos, dists[h]), (beam, h)))
            elif not boundary and len(grown) < B:
                grown.append((h, t, total))
        finished.sort(key=lambda f: -f[0])
        best_live = max((total for _, _, total in grown), default=float("-inf"))
        if not grown or len(finished) >= B and finished[B - 1][0] >= best_live:
            break
        beam = beam.select([h for h, _, _ in grown])
        step = beam.extend([[t] for _, t, _ in grown])
        live = [(live[h][0] + [t], live[h][1] + [dists[h][t].item()], total) for h, t, total in grown]
        dists = [step[i, 0] for i in range(len(grown))]
        # a hypothesis whose own text ends in whitespace is a complete word whatever comes next
        done = [i for i, (ids, _, _) in enumerate(live) if is_word_complete(m.text_of(ids, context), None, False)]
        for i in done:
            ids, lps, total = live[i]
            finished.append((total, Word(ids, lps, m.text_of(ids, context), False, dists[i]), (beam, i)))
        if done:
            keep = [i for i in range(len(live)) if i not in done]
            beam, live, dists = beam.select(keep), [live[i] for i in keep], [dists[i] for i in keep]
            if not live:
                break
    else:  # the length cap: live hypotheses end as cut words
        for i, (ids, lps, total) in enumerate(live):
            finished.append((total, Word(ids, lps, m.text_of(ids, context), False, dists[i]), (beam, i)))
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


def choose_winner(fused: list[float]) -> int:
    """Index of the lowest fused score; ties go to the earliest candidate in pool order."""
    return min(range(len(fused)), key=fused.__getitem__)


def score_candidates(m: Member, k: int, prefix_text: str, pool: list[Candidate]) -> None:
    """Append model k's Score (and where the scored ids are cached) to every candidate."""
    foreign = [c for c in pool if k not in c.proposals]
    foreign_scores = iter(score_foreign(m, prefix_text, foreign)) if foreign else iter(())
    for c in pool:
        if k in c.proposals:
            p = c.proposals[k]
            lps = [lp for w in p.words for lp in w.logprobs]
            if p.eos:
                lps.append(m.eos_logprob(p.words[-1].next_logprobs))
            c.scores.append(Score(len(m.ids), p.ids, p.eos, -sum(lps) / len(lps)))
            c.homes.append((p.rows, p.row))
        else:
            score, home = next(foreign_scores)
            c.scores.append(score)
            c.homes.append(home)


def score_foreign(m: Member, prefix_text: str, cands: list[Candidate]) -> list[tuple[Score, tuple[Rows, int]]]:
    """Score candidates that m did not propose, as m's tokenizer encodes them in context, in one batch.

    The ids are those of encode(prefix text + candidate) after their longest common prefix with m's
    context. Where the boundary re-tokenises, the context is cut back to that common prefix and the
    re-tokenised ids count as part of the candidate (spec §4).
    """
    encoded = [m.encode(prefix_text + c.text) for c in cands]
    kept = [common_prefix(e, m.ids) for e in encoded]
    if min(kept) == 0:  # only a one-token prompt can re-tokenise from its very first token
        raise DataError(f"model {m.name!r}: the prompt is too short to score {cands[kept.index(0)].text!r} after it")
    # Reading starts at the shortest kept context; one position earlier if that is inside the
    # committed context, since the first scored token needs the logits of the token before it.
    base = len(m.ids) if min(kept) == len(m.ids) else min(kept) - 1
    rows = m.fork(len(cands), upto=base)
    inputs = [e[base:] for e in encoded]
    step = rows.extend(inputs) if any(inputs) else None

    def dist_before(row: int, position: int) -> torch.Tensor:
        """The distribution that predicts the token at `position` of row `row`."""
        return m.logprobs if position == len(m.ids) == base else step[row, position - 1 - base]

    results = []
    for i, (c, e, keep) in enumerate(zip(cands, encoded, kept)):
        lps = [dist_before(i, j)[e[j]].item() for j in range(keep, len(e))]
        if c.eos:
            lps.append(m.eos_logprob(dist_before(i, len(e))))
        if not lps:
            raise AssertionError(f"model {m.name!r} has no tokens to score for candidate {c.text!r}")
        results.append((Score(keep, e[keep:], c.eos, -sum(lps) / len(lps)), (rows, i)))
    return results


# ---- stopping (spec §5) --------------------------------------------------------------------------


def _stopped(text: str, best: Candidate, stop, members: list[Member], max_new_tokens: int) -> tuple[str, str]:
    """The text after this round's winner, and why decoding stops ("" to go on)."""
    text, cut = cut_at_stop(text, best.text, stop)
    if cut:
        return text, "stop"
    if best.eos:
        return text, "eos"
    if any(len(m.generated_ids) >= max_new_tokens for m in members):
        return text, "length"
    return text, ""


def cut_at_stop(text: str, new: str, stop) -> tuple[str, bool]:
    """Append `new` to `text`; if a stop string now occurs, cut before its first occurrence."""
    whole = text + new
    start = max(0, len(text) - max((len(s) for s in stop), default=0) + 1)
    hits = [i for i in (whole.find(s, start) for s in stop if s) if i >= 0]
    return (whole[: min(hits)], True) if hits else (whole, False)


def _round_trace(round_idx: int, model_rounds, pool: list[Candidate], fused: list[float], winner: int) -> RoundTrace:
    candidates = [CandidateTrace(c.text, c.eos, c.proposers, c.words, c.scores, f) for c, f in zip(pool, fused)]
    return RoundTrace(round_idx, list(model_rounds), candidates, winner)
