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
3. optionally (`normalize`), each evaluator's scores are divided by their mean over the pool;
4. the outlier filter (`outlier_ratio` = λ = 10): when a span's largest score exceeds λ times its
   smallest, the largest and the smallest are dropped; when that would leave nothing (two
   evaluators) only the largest is dropped. The span's score is the mean of what remains;
5. the lowest score wins (ties to the earliest span in pool order) and is appended to G verbatim.

Stopping is AdaFuse's (spec §5): a stop string in G (G is cut before it), a winning span that ends
at eos, or any member's `max_new_tokens` used up.

Choices where the notes leave one open or where the upstream description is wrong for us:

- No separating space: upstream joins spans with " ".join. Our words carry their own leading
  whitespace (" Paris", "\\n\\nQuestion:"), so the span text is appended verbatim; a join would
  double spaces and could never produce a newline.
- A span ends early at the word that completes a stop string (within G + span): the text after it
  can never be output, and generating it would only cost passes (upstream's span generation stops
  at the task's stop strings too). It also ends at eos, or at `span_words` words.
- The filter compares max > λ·min rather than max/min > λ, so a zero NLL (a token the model is
  certain of) is handled without a division by zero: any positive score is then an outlier.
- `normalize` divides each evaluator's NLLs by their mean over this round's pool (a mean of 0 leaves
  them 0), so models with different perplexity scales weigh alike; off by default, as the notes
  could not confirm the paper uses it.
- Members keep their KV caches: a member reads each token it proposes once, the others' spans once
  (batched), and commits the winner without reading it again, so no prefix is re-read per span
  (the quadratic cost of the naive algorithm, §3.4).
"""

from dataclasses import dataclass

from adafuse.errors import ConfigError


@dataclass
class SweetSpanConfig:
    """Knobs of `method=sweetspan`."""

    span_words: int = 4  # L: words per proposed span (the AdaFuse authors' scripts default to 4)
    outlier_ratio: float = 10.0  # λ: a span's scores with max > λ·min lose their extremes
    normalize: bool = False  # divide each evaluator's scores by their mean over the pool first
    max_word_tokens: int = 16  # a word is cut after this many tokens (spec §2.3)

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
    scores = normalized(nll) if cfg.normalize else nll
    kept = [kept_by_filter(row, cfg.outlier_ratio) for row in scores]
    return [sum(row[k] for k in keep) / len(keep) for row, keep in zip(scores, kept)], kept
