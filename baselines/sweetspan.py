"""`method=sweetspan`: SweetSpan (Xu, Chen, Wu, Zhang, 2024), span-level ensemble decoding.

Research notes: ../shared/research/baselines.md §3 (no official code exists; the rules below are
those the notes infer from the paper and from the AdaFuse authors' scripts). Each round:

1. every member proposes a span of `span_words` words continuing the shared text G, greedily, cut
   at word boundaries by spec §2's word rule (a word is a run of non-whitespace characters with the
   whitespace before it);
2. every member scores every distinct span (keyed by text and eos, in pool order: member order) by
   its mean token NLL in its own tokenisation: its own generated ids for its own span, the seam's
   alignment of the span's text for the others (one batched forward pass per member), exactly as
   AdaFuse scores candidates (spec §4), an eos-ended span including the eos token;
3. what is filtered and averaged (`score`): the mean NLLs themselves (`nll`, the default), or the
   perplexities exp(mean NLL) (`perplexity`), which is what the helper the notes infer the filter
   from was written for (the AdaFuse authors' `filter_perplexities(ppl_values, lambda_val=10.0)`,
   never called there; their `compute_span_perplexity` had its `exp` commented out) and what the
   SweetSpan paper names its scores. The two can pick different spans: a ratio of 10 between
   perplexities is a gap of ln 10 = 2.3 nats, between NLLs a factor of 10. `perplexity` is the
   paper protocol's setting (conf/protocol_method/paper_sweetspan.yaml); `nll` keeps the score
   AdaFuse uses, so the two methods' pools compare alike;
4. optionally (`normalize`), each evaluator's scores are divided by their mean over the pool;
5. the outlier filter (`outlier_ratio` = λ = 10): when a span's largest score exceeds λ times its
   smallest, the largest and the smallest are dropped; when that would leave nothing (two
   evaluators) only the largest is dropped. The span's score is the mean of what remains;
6. the lowest score wins (ties to the earliest span in pool order) and is appended to G verbatim.

Stopping is AdaFuse's (spec §5): a stop string in G (G is cut before it), a winning span that ends
at eos, or any member's `max_new_tokens` used up.

Choices where the notes leave one open or where the upstream description is wrong for us:

- No separating space: upstream joins spans with " ".join. Our words carry their own leading
  whitespace (" Paris", "\\n\\nQuestion:"), so the span text is appended verbatim; a join would
  double spaces and could never produce a newline.
- A span ends early once G + span holds a stop string: the text after it can never be output, and
  generating it would only cost passes (upstream's span generation stops at the task's stop strings
  too). It ends at the word that completes the stop string or, when a word's first token already
  completes it ("\n\n" of "\n\nQuestion:" for the stop "\n"), at that token alone, read as a
  one-token word. It also ends at eos, or at `span_words` words.
- The filter compares max > λ·min rather than max/min > λ, so a zero NLL (a token the model is
  certain of) is handled without a division by zero: any positive score is then an outlier.
- `normalize` divides each evaluator's scores by their mean over this round's pool (a mean of 0
  leaves them 0), so models with different perplexity scales weigh alike; off by default, as the
  notes could not confirm the paper uses it.
- The filter drops one largest and one smallest score; the helper it is inferred from drops every
  score equal to either (the same with two evaluators; with three or more, only on exact ties).
- Members keep their KV caches: a member reads each token it proposes once, the others' spans once
  (batched), and commits the winner without reading it again, so no prefix is re-read per span
  (the quadratic cost of the naive algorithm, §3.4).
"""

import math
from dataclasses import dataclass

from adafuse.errors import ConfigError, UnknownNameError
from adafuse.member.passes import together
from adafuse.methods import Method
from adafuse.methods.completion import complete_words
from adafuse.methods.pool import Proposal, build_pool, choose_winner, commit, score_pool
from adafuse.methods.session import Session
from adafuse.methods.stopping import cut_at_stop
from adafuse.text.words import CHAR_SLACK
from adafuse.trace import Score

SCORES = ("nll", "perplexity")


@dataclass
class SweetSpanConfig:
    """Knobs of `method=sweetspan`."""

    span_words: int = 4  # L: words per proposed span (the AdaFuse authors' scripts default to 4)
    outlier_ratio: float = 10.0  # λ: a span's scores with max > λ·min lose their extremes
    normalize: bool = False  # divide each evaluator's scores by their mean over the pool first
    max_word_tokens: int = 16  # a word is cut after this many tokens (spec §2.3)
    score: str = "nll"  # what is filtered and averaged: nll (mean NLL) or perplexity (exp of it)

    def __post_init__(self):
        if self.span_words < 1:
            raise ConfigError(f"sweetspan: span_words must be >= 1, got {self.span_words}")
        if not self.outlier_ratio > 1:  # also rejects NaN
            raise ConfigError(
                f"sweetspan: outlier_ratio (λ) must be > 1 (max > λ·min marks outliers; .inf disables the "
                f"filter), got {self.outlier_ratio}"
            )
        if self.max_word_tokens < 1:
            raise ConfigError(f"sweetspan: max_word_tokens must be >= 1, got {self.max_word_tokens}")
        if self.score not in SCORES:
            raise UnknownNameError("sweetspan score", self.score, SCORES)


# ---- fusing one span's scores ---------------------------------------------------------------------


def kept_by_filter(scores: list[float], ratio: float) -> list[int]:
    """Indices of the evaluators whose scores count for one span (the outlier filter).

    If max > ratio * min, drop the (first) largest and the (first) smallest; if that leaves nothing,
    drop only the largest. Otherwise keep all.
    """
    hi = max(range(len(scores)), key=scores.__getitem__)
    lo = min(range(len(scores)), key=scores.__getitem__)
    if not scores[hi] > ratio * scores[lo]:
        return list(range(len(scores)))
    kept = [k for k in range(len(scores)) if k not in (hi, lo)]
    return kept or [lo]


def normalized(nll: list[list[float]]) -> list[list[float]]:
    """nll[c][k] (span c, evaluator k) divided by evaluator k's mean over the spans (0 stays 0)."""
    means = [sum(column) / len(column) for column in zip(*nll)]
    return [[s / m if m > 0 else 0.0 for s, m in zip(row, means)] for row in nll]


def fused_scores(nll: list[list[float]], cfg: SweetSpanConfig) -> tuple[list[float], list[list[int]]]:
    """Each span's score (lower is better) and the evaluators the filter kept for it."""
    scores = [[math.exp(s) for s in row] for row in nll] if cfg.score == "perplexity" else nll
    scores = normalized(scores) if cfg.normalize else scores
    kept = [kept_by_filter(row, cfg.outlier_ratio) for row in scores]
    return [sum(row[k] for k in keep) / len(keep) for row, keep in zip(scores, kept)], kept


# ---- decoding -------------------------------------------------------------------------------------


@dataclass
class SpanCandidate:
    """One distinct span of a round, as `trace=true` records it."""

    text: str
    eos: bool  # the span ends at end-of-sequence
    proposers: list[int]  # members that proposed it, in member order
    words: int
    scores: list[Score]  # per member: the ids it read (after `base` context ids) and their mean NLL
    kept: list[int]  # members whose scores the outlier filter kept
    score: float  # the mean of the kept (normalised) NLLs or perplexities; the lowest wins


@dataclass
class SpanRound:
    round_idx: int
    candidates: list[SpanCandidate]  # pool order: member order
    winner: int


def positions_needed(cfg: SweetSpanConfig, max_new_tokens: int) -> int:
    """The budget, overrun by at most one round's span (each word may run on to finish a character)."""
    return max_new_tokens + cfg.span_words * (cfg.max_word_tokens + CHAR_SLACK)


def decode(s: Session, cfg: SweetSpanConfig):
    """Decode the session's request with its members (K >= 1), one span per round (a program: every
    member's proposal and scores in the same engine steps)."""
    while not s.done:
        yield from one_round(s, cfg)


def one_round(s: Session, cfg: SweetSpanConfig):
    """Every member's span, every member's scores of the pool, the winner committed (a program); the round's forks
    end with it, not at the next round's pool."""
    round_idx = s.rounds
    spans = yield from together([propose_span(m, cfg, s.text, s.stop) for m in s.members])
    pool = build_pool([[span] for span in spans])
    yield from score_pool(s.members, s.text, pool, round_idx)
    fused, kept = fused_scores([[score.nll for score in c.scores] for c in pool], cfg)
    winner = choose_winner(fused)
    if s.tracing:
        spans = [
            SpanCandidate(c.text, c.eos, c.proposers, c.words, c.scores, keep, f)
            for c, keep, f in zip(pool, kept, fused)
        ]
        s.log(SpanRound(round_idx, spans, winner))
    commit(s, pool[winner])


def propose_span(m, cfg: SweetSpanConfig, generated: str, stop: tuple[str, ...]):
    """Member m's span, a Proposal (a program): up to `span_words` greedy words after the generated text
    `generated` (spec §2's word rule).

    The span ends early at end-of-sequence, at a word cut at the token cap, or as soon as `generated` +
    span holds a stop string (nothing after it could be output): at the word that completes it, or,
    when a word's first token already completes it, at that token alone (read as a one-token word).
    """
    rows = m.fork(1)
    logprobs, words, text = m.logprobs, [], ""
    while len(words) < cfg.span_words:
        first = m.tokenisation.tokens.choose(logprobs)
        context = m.ids + [i for w in words for i in w.ids]
        stops = (
            first not in m.tokenisation.eos_ids and cut_at_stop(generated, text + m.text_of([first], context), stop)[1]
        )
        (word,) = yield from complete_words(m, rows, [first], logprobs, words, 1 if stops else cfg.max_word_tokens)
        words.append(word)
        text += word.text
        if word.eos or word.cut or stops or cut_at_stop(generated, text, stop)[1]:
            break
        logprobs = word.next_logprobs
    return Proposal(words, rows, 0)


METHOD = Method(SweetSpanConfig, decode, positions_needed)
