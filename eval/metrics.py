"""Standard metrics: SQuAD v1.1 EM/F1, numeric accuracy, and sacrebleu BLEU/chrF/spBLEU.

Every metric scores every row: an empty prediction is the empty string and scores what it earns (0 for
EM/acc), never dropped. The paper's lenient replicas live in `eval/paper_metrics.py` and join this
registry once that module is imported.

A corpus metric (BLEU, chrF, spBLEU) also gives each example's sufficient statistics (`Metric.statistics`):
sacrebleu scores a corpus from the sum of its sentences' n-gram counts, so the score of any resample of the
examples is the score of its summed counts, the very number its corpus score gives (integers summed in any order),
which is how sacrebleu's own bootstrap resamples. Tables and reports resample through them (eval/bootstrap.py).
"""

import os
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from adafuse.registry import Registry

PerExample = Callable[[str, list[str]], float]
Corpus = Callable[[list[str], list[list[str]]], float]
# predictions (n,), references (n, k) -> each example's statistics (n, s) int64 and the score of their column sums
Statistics = Callable[[list[str], list[list[str]]], tuple[np.ndarray, Callable[[list[int]], float]]]


@dataclass(frozen=True)
class Metric:
    """A metric as the harness sees it: predictions (n,) and references (n, refs per example) -> one number."""

    per_example: PerExample | None  # one prediction vs its references; None where only a corpus score makes sense
    corpus: Corpus  # the reported number, on a 0-100 scale
    raw: bool = False  # True: scores the raw generation and extracts its own answer (the paper replicas)
    scale: float = 100.0  # mean per-example score x scale is on the corpus's 0-100 scale (1 for sentence BLEU)
    # A BLEU: the sacrebleu tokenizer its corpus score uses now. metrics.json records it, and tables refuse to
    # compare BLEUs tokenized differently: the same text scores another number.
    bleu_tokenizer: Callable[[], str] | None = None
    # A corpus metric's per-example statistics, whose sum it scores (module docstring); None: recomputed from text
    statistics: Statistics | None = None


METRICS = Registry("metric")


def averaged(per_example: PerExample) -> Corpus:
    """The corpus score 100 * mean(per-example score), refusing misaligned or empty inputs."""

    def corpus(predictions: list[str], references: list[list[str]]) -> float:
        if not predictions:
            raise ValueError("no examples to score")
        scores = [per_example(pred, refs) for pred, refs in zip(predictions, references, strict=True)]
        return 100 * sum(scores) / len(scores)

    # Tools that resample examples (scripts/make_table.py) average the stored per-example scores instead.
    corpus.averages = per_example
    return corpus


# --- SQuAD v1.1 (the official evaluate-v1.1.py definitions) -------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def drop_punctuation(text: str) -> str:
    """Remove ASCII punctuation (`string.punctuation`); curly quotes and dashes survive, as in the official script."""
    return "".join(ch for ch in text if ch not in _PUNCTUATION)


def squad_normalize(text: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    return " ".join(_ARTICLES.sub(" ", drop_punctuation(text.lower())).split())


def _token_f1(prediction: str, answer: str) -> float:
    pred_tokens = squad_normalize(prediction).split()
    answer_tokens = squad_normalize(answer).split()
    shared = sum((Counter(pred_tokens) & Counter(answer_tokens)).values())
    if shared == 0:  # as in the official script, this also makes two empty answers score 0, not 1
        return 0.0
    precision = shared / len(pred_tokens)
    recall = shared / len(answer_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_em(prediction: str, references: list[str]) -> float:
    """1.0 if the normalised prediction equals any normalised reference ("the" vs "a" counts: both are "")."""
    return max(float(squad_normalize(prediction) == squad_normalize(ref)) for ref in references)


def squad_f1(prediction: str, references: list[str]) -> float:
    """Best token-level F1 (bag-of-tokens overlap) against any reference."""
    return max(_token_f1(prediction, ref) for ref in references)


METRICS.register("em")(Metric(squad_em, averaged(squad_em)))
METRICS.register("f1")(Metric(squad_f1, averaged(squad_f1)))


# --- GSM8K numeric accuracy ---------------------------------------------------------------------------------


def _parse_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def numeric_acc(prediction: str, references: list[str]) -> float:
    """1.0 if the prediction parses as a number equal to a reference number ("18" == "18.0", "1,000" == "1000")."""
    value = _parse_number(prediction)
    return float(value is not None and any(value == _parse_number(ref) for ref in references))


METRICS.register("acc")(Metric(numeric_acc, averaged(numeric_acc)))


# --- sacrebleu: BLEU, chrF, spBLEU --------------------------------------------------------------------------


def reference_streams(references: list[list[str]]) -> list[list[str]]:
    """(n, k) references per example -> sacrebleu's k streams of n references each."""
    counts = sorted({len(refs) for refs in references})
    if len(counts) > 1:
        raise ValueError(f"every example needs the same number of references; found counts {counts}")
    return [list(stream) for stream in zip(*references)]


def corpus_score(scorer: BLEU | CHRF, predictions: list[str], references: list[list[str]]) -> float:
    """sacrebleu's corpus score, equal to what its command line prints for the same files."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
    return scorer.corpus_score(predictions, reference_streams(references)).score


def sacrebleu_statistics(scorer_of: Callable[[], BLEU | CHRF]) -> Statistics:
    """`Metric.statistics` of sacrebleu's corpus score with the scorer `scorer_of()` gives (made on first use)."""

    def statistics(predictions: list[str], references: list[list[str]]):
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
        scorer = scorer_of()
        counts = scorer._extract_corpus_statistics(predictions, reference_streams(references))
        return np.asarray(counts, dtype=np.int64), lambda summed: scorer._compute_score_from_stats(summed).score

    return statistics


_BLEU = BLEU()
_SENTENCE_BLEU = BLEU(effective_order=True)  # the CLI's sentence-level setting: one missing 4-gram would give 0
_CHRF = CHRF()


def sentence_bleu(prediction: str, references: list[str]) -> float:
    return _SENTENCE_BLEU.sentence_score(prediction, references).score


def sentence_chrf(prediction: str, references: list[str]) -> float:
    return _CHRF.sentence_score(prediction, references).score


METRICS.register("bleu")(
    Metric(
        sentence_bleu,
        partial(corpus_score, _BLEU),
        scale=1.0,
        bleu_tokenizer=lambda: _BLEU.tokenizer_signature,
        statistics=sacrebleu_statistics(lambda: _BLEU),
    )
)
METRICS.register("chrf")(
    Metric(sentence_chrf, partial(corpus_score, _CHRF), scale=1.0, statistics=sacrebleu_statistics(lambda: _CHRF))
)


def spm_model_path() -> str:
    """Where sacrebleu keeps the flores101 SentencePiece model that spBLEU tokenises with."""
    return os.path.join(sacrebleu.utils.SACREBLEU_DIR, "models", "sacrebleu_tokenizer_spm.model")


def spbleu_available() -> bool:
    """True when spBLEU can run offline; the harness skips `spbleu` otherwise (metrics.json says so)."""
    return os.path.exists(spm_model_path())


@lru_cache(maxsize=2)
def _loaded_flores101_bleu(effective_order: bool) -> BLEU:
    return BLEU(tokenize="flores101", effective_order=effective_order)


def flores101_bleu(effective_order: bool = False) -> BLEU:
    """BLEU on flores101 SentencePiece pieces; refuses to run rather than let sacrebleu download the model."""
    if not spbleu_available():
        raise FileNotFoundError(
            f"spBLEU needs the flores101 SentencePiece model at {spm_model_path()}; "
            "a run never downloads it: python scripts/prepare_data.py DATA_DIR fetches it once (or copy the file there)"
        )
    return _loaded_flores101_bleu(effective_order)


def sentence_spbleu(prediction: str, references: list[str]) -> float:
    return flores101_bleu(effective_order=True).sentence_score(prediction, references).score


def corpus_spbleu(predictions: list[str], references: list[list[str]]) -> float:
    return corpus_score(flores101_bleu(), predictions, references)


METRICS.register("spbleu")(
    Metric(
        sentence_spbleu,
        corpus_spbleu,
        scale=1.0,
        bleu_tokenizer=lambda: flores101_bleu().tokenizer_signature,
        statistics=sacrebleu_statistics(flores101_bleu),
    )
)
