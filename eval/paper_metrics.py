"""Replicas of the AdaFuse authors' lenient scorers (CCM0111/AdaFuse `evaluation/`, research notes §5).

They let our numbers sit beside the paper's Table 1; report them next to the standard metrics, never
instead of them. Each takes the raw generation and extracts its answer the authors' way (`authors_pred`:
baselines/authors_rules.py `generation_pred`, the rules `method=adafuse_code` decodes by).

Number words follow the authors' scripts as they run once `word2number` is importable (their requirements.txt
lists it; as shipped, eval_nq.py and eval_squad.py never import it and crash with NameError on most answers, so
no NQ or SQuAD score of theirs can come from that code): NQ and SQuAD turn runs of number words into digits
while normalising, and all three QA scorers read a whole normalised answer as a number with word2number. We
call the same library at the same points, with the same exception handling, and take its quirks with it (it
keeps only the words it knows, so every "N million" reads as 1000000 and "turning point" as 0). Where their code
would still crash (an `int()` on "²", word2number's IndexError on "thousand five" outside their `try`), ours
treats the answer as no number (see `_as_number`).

One difference remains on purpose: the authors joined predictions to references on the lower-cased
question, which merges duplicate questions (2500 -> 2497 SQuAD rows); we score every row.
tests/unit/test_authors_scorers.py holds these replicas to the verdicts of the authors' own scripts on our
committed grid predictions (tests/fixtures/authors_scorers/README.md).
"""

import re
import unicodedata

import numpy as np
from sacrebleu.metrics import BLEU
from word2number import w2n

from baselines.authors_rules import generation_pred as authors_pred
from eval.metrics import (
    METRICS,
    Metric,
    averaged,
    corpus_score,
    drop_punctuation,
    flores101_bleu,
    spbleu_available,
    squad_normalize,
)

# --- QA: NQ, SQuAD, TriviaQA ---------------------------------------------------------------------------------

# The authors' list for NQ and SQuAD: articles, conjunctions, prepositions, auxiliaries, wh-words, modals.
_STOPWORDS = (
    "a an the and or in on of for to with at by from about as is was were be been are has have had do does did "
    "but so if then than that which who whom whose because while where when how what why can will would should "
    "could shall may might must"
).split()
_STOPWORD_PATTERN = re.compile(r"\b(?:" + "|".join(_STOPWORDS) + r")\b")
# eval_nq.py's possessive rule, `\b(\w+)['']s\b` (two straight quotes), runs after punctuation removal has
# deleted every straight apostrophe, so it never fires: "Obama's" becomes "obamas" and the plural rule makes it
# "obama", while a curly "Obama’s" keeps its apostrophe and becomes "obama’". We have no possessive step for NQ.
_SQUAD_POSSESSIVE = re.compile(r"(\w+)'s\b")

# --- number words: where their scorers call word2number ------------------------------------------------------

# The words their eval_nq.py/eval_squad.py number-word pattern lists, in its order (the alternation tries them in
# this order); eval_trivia.py's NUM_WORDS is the same set. word2number itself knows "point" but not "trillion".
_NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion trillion"
).split()
# A run of one to four of them, each optionally followed by " and" and then by whitespace or a hyphen, ending
# at a word boundary. The run takes the whitespace after its last word with it: "One Direction" -> "1Direction".
_NUMBER_WORD_RUN = re.compile(r"\b(?:(?:" + "|".join(_NUMBER_WORDS) + r")(?:\s+and)?(?:\s+|-)?){1,4}\b", re.IGNORECASE)
_LETTER_RUN = re.compile(r"[a-zA-Z]+")


def _number_words_to_digits(text: str) -> str:
    """Mirrors `replace_number_words_with_digits` inside eval_nq.py's and eval_squad.py's `normalize_answer`:
    each run of `_NUMBER_WORD_RUN` (any case) becomes `str()` of word2number's reading of it, with hyphens made
    spaces and " and " made a space; a run that word2number rejects with any exception (they catch `Exception`:
    "trillion" alone, "thousand five") stays as it was. "twenty-one" -> "21", "22.1 million" -> "22.1 1000000"."""

    def digits(run: re.Match) -> str:
        words = run.group(0)
        try:
            return str(w2n.word_to_num(words.replace("-", " ").replace(" and ", " ")))
        except Exception:  # as theirs: whatever word2number raises leaves the words as they are
            return words

    return _NUMBER_WORD_RUN.sub(digits, text)


def _as_number(normalized: str) -> int | float | None:
    """Mirrors `_num_equiv_any` of eval_nq.py and eval_squad.py, on a normalised answer: a string of digits is
    its integer; anything else is what word2number reads in it, and its ValueError (no number word it knows, or
    a malformed or repeated multiplier) means no number. word2number keeps only the words it knows and drops the
    rest, digits included: "hundred" is 100, "turning point" is 0 ("point" alone), "1 1000000" is no number.

    Where their code crashes, ours says "no number", so that only the string rules decide (their
    eval_trivia.py catches every exception here):
    * they test `str.isdigit()`, which also passes digits like "²" that `int()` then rejects with a ValueError
      outside their `try`; `isdecimal()` keeps "²" away from `int()`, and word2number rejects it;
    * word2number raises IndexError when a multiplier has no number before it ("thousand five", "million
      thousand"), and they catch only ValueError. Their normaliser leaves such a run as words, so it reaches
      this step. No prediction or reference in our grid does (tests/fixtures/authors_scorers/README.md)."""
    if normalized.isdecimal():
        return int(normalized)
    try:
        return w2n.word_to_num(normalized)
    except ValueError:
        return None
    except IndexError:  # their crash; see above
        return None


def _as_number_trivia(normalized: str) -> int | float | None:
    """Mirrors `_num_equiv_any` of eval_trivia.py: nothing for an empty answer; a string of digits is its
    integer ("²" as in `_as_number`); else word2number's reading, only when a run of ASCII letters is one of
    `_NUMBER_WORDS` (so "point" alone is no number here), and no number when word2number raises anything (they
    catch `Exception`). Its normaliser converts no number words first: "22.1 million" reads as 1000000."""
    if not normalized:
        return None
    if normalized.isdecimal():
        return int(normalized)
    if not any(letters in _NUMBER_WORDS for letters in _LETTER_RUN.findall(normalized)):
        return None
    try:
        return w2n.word_to_num(normalized)
    except Exception:  # as theirs
        return None


def _singular(token: str) -> str:
    return token[:-1] if len(token) >= 4 and token.endswith("s") and not token.endswith("ss") else token


def _nq_normalize(text: str) -> str:
    """Mirrors eval_nq.py's `normalize_answer`: NFD, number words to digits, lower-case, ASCII punctuation,
    stopwords, then a crude singular of 4+ letter tokens."""
    text = drop_punctuation(_number_words_to_digits(unicodedata.normalize("NFD", text)).lower())
    return " ".join(_singular(token) for token in _STOPWORD_PATTERN.sub(" ", text).split())


def _squad_lenient_normalize(text: str) -> str:
    """Mirrors eval_squad.py's `normalize_answer`: NFD, number words to digits, possessive 's (before
    lower-casing, as the authors did), lower-case, ASCII punctuation, stopwords."""
    text = _SQUAD_POSSESSIVE.sub(r"\1", _number_words_to_digits(unicodedata.normalize("NFD", text)))
    return " ".join(_STOPWORD_PATTERN.sub(" ", drop_punctuation(text.lower())).split())


def _trivia_normalize(text: str) -> str:
    """Mirrors eval_trivia.py's `normalize_answer`: NFD, then the official SQuAD normalisation (articles and
    punctuation only; no number words converted)."""
    return squad_normalize(unicodedata.normalize("NFD", text))


def _token_subset(pred_tokens: list[str], gold_tokens: list[str], max_length_gap: int) -> bool:
    """Every token of the shorter side is in the longer one, unless the shorter has 3+ tokens and the gap is big."""
    if not pred_tokens or not gold_tokens:
        return False
    # On a tie the prediction is the "shorter" side, as in the authors' code (it decides which tokens must match).
    shorter, longer = (pred_tokens, gold_tokens) if len(pred_tokens) <= len(gold_tokens) else (gold_tokens, pred_tokens)
    if len(shorter) >= 3 and len(longer) - len(shorter) > max_length_gap:
        return False
    return all(token in longer for token in shorter)


def _lenient_match(pred: str, gold: str, as_number, max_length_gap: int) -> bool:
    """Mirrors their `exact_match_score` on normalised strings: equal, or the same number (`as_number` of both
    sides; theirs reads both before comparing), or the token-subset rule."""
    if pred == gold:
        return True
    pred_number, gold_number = as_number(pred), as_number(gold)
    if pred_number is not None and pred_number == gold_number:
        return True
    return _token_subset(pred.split(), gold.split(), max_length_gap)


def _best_lenient_match(generation: str, aliases: list[str], normalize, as_number, max_length_gap: int) -> float:
    """Their `metric_max_over_ground_truths` over the aliases."""
    pred = normalize(authors_pred(generation))
    return max(float(_lenient_match(pred, normalize(alias), as_number, max_length_gap)) for alias in aliases)


def paper_em_nq(generation: str, aliases: list[str]) -> float:
    """Mirrors eval_nq.py. Lenient: number words become digits and "1" equals "one"; stopwords and a plural s
    (so the s of a straight-apostrophe 's too) are dropped before comparing, and a 1-2 token answer counts as
    correct when its tokens all appear anywhere in the other side."""
    return _best_lenient_match(generation, aliases, _nq_normalize, _as_number, max_length_gap=1)


def paper_em_squad(generation: str, aliases: list[str]) -> float:
    """Mirrors eval_squad.py. Lenient like NQ (no plural rule), and the subset rule still applies to 3+ token
    answers unless the lengths differ by more than 5 tokens."""
    return _best_lenient_match(generation, aliases, _squad_lenient_normalize, _as_number, max_length_gap=5)


def paper_em_trivia(generation: str, aliases: list[str]) -> float:
    """Mirrors eval_trivia.py. Official SQuAD normalisation (no stopwords, no number words converted), plus
    equal numbers as word2number reads them ("two" is 2, any "N million" is 1000000) and the NQ token-subset
    rule (gap > 1 refused for 3+ tokens)."""
    return _best_lenient_match(generation, aliases, _trivia_normalize, _as_number_trivia, max_length_gap=1)


METRICS.register("paper_em_nq")(Metric(paper_em_nq, averaged(paper_em_nq), raw=True))
METRICS.register("paper_em_squad")(Metric(paper_em_squad, averaged(paper_em_squad), raw=True))
METRICS.register("paper_em_trivia")(Metric(paper_em_trivia, averaged(paper_em_trivia), raw=True))


# --- GSM8K ---------------------------------------------------------------------------------------------------

_FIRST_BOXED = re.compile(r"\\boxed\{([^}]+)\}")  # the first box, no nested braces: as eval_gsm.py reads it
_GOLD_ANSWER_IS = re.compile(r"[Tt]he answer is\s+(.*)")
_NOT_DIGIT_OR_DOT = re.compile(r"[^\d.]")


def _gsm_normalize(text: str) -> str:
    """Keep only digits and dots, then "%.2f"; a string float() rejects ("16.3.18.", ".") is kept as it is."""
    digits_and_dots = _NOT_DIGIT_OR_DOT.sub("", text)
    try:
        return f"{round(float(digits_and_dots), 2):.2f}"
    except ValueError:
        return digits_and_dots


def _gsm_lenient_equal(pred: str, gold: str) -> bool:
    return bool(pred and gold) and (pred == gold or pred in gold or gold in pred)


def paper_acc_gsm(generation: str, references: list[str]) -> float:
    """Mirrors eval_gsm.py. pred = the first `\\boxed{...}` or else the whole (cut) generation; gold = the text
    after "the answer is", or the whole reference (ours are plain numbers). Lenient: after keeping only digits
    and dots, a match is equality OR either string inside the other, so "8" matches "18", an unboxed chain of
    thought matches when its concatenated digits end in the answer, and a lone "." matches every answer."""
    cut = authors_pred(generation)
    boxed = _FIRST_BOXED.search(cut)
    pred = _gsm_normalize(boxed.group(1).strip() if boxed else cut)
    golds = [(m.group(1).strip() if (m := _GOLD_ANSWER_IS.search(ref)) else ref) for ref in references]
    return max(float(_gsm_lenient_equal(pred, _gsm_normalize(gold))) for gold in golds)


METRICS.register("paper_acc_gsm")(Metric(paper_acc_gsm, averaged(paper_acc_gsm), raw=True))


# --- Flores spBLEU -------------------------------------------------------------------------------------------


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _single_reference(references: list[str]) -> str:
    if len(references) != 1:
        raise ValueError(f"the authors' spBLEU takes one reference per example, got {len(references)}")
    return references[0]


def paper_bleu_scorer() -> BLEU:
    """The authors' tokenize="spm" (flores101 SentencePiece) when `spbleu_available()`, else sacrebleu's default
    13a, which gives another number: metrics.json records which (`Metric.bleu_tokenizer`)."""
    return flores101_bleu() if spbleu_available() else BLEU()


def _scored_rows(generations: list[str], references: list[list[str]]) -> list[tuple[str, str] | None]:
    """Each row as the authors' spBLEU scores it, (prediction, reference) in NFC, or None where it is dropped."""
    if len(generations) != len(references):
        raise ValueError(f"{len(generations)} generations but {len(references)} reference lists")
    rows = [(authors_pred(gen), _single_reference(refs).strip()) for gen, refs in zip(generations, references)]
    return [(_nfc(pred), _nfc(ref)) if pred and ref else None for pred, ref in rows]


def paper_bleu(generations: list[str], references: list[list[str]]) -> float:
    """Mirrors eval_spbleu.py. Lenient: rows whose (cut, stripped) prediction or reference is empty are
    DROPPED instead of scoring 0, then corpus BLEU on NFC text, tokenized by `paper_bleu_scorer`. 0.0 when
    every row is dropped (the authors' script printed no score then)."""
    kept = [row for row in _scored_rows(generations, references) if row is not None]
    if not kept:
        return 0.0
    return corpus_score(paper_bleu_scorer(), [pred for pred, _ in kept], [[ref] for _, ref in kept])


def paper_bleu_statistics(generations: list[str], references: list[list[str]]):
    """`Metric.statistics` of `paper_bleu`: a dropped row counts nothing; the last column counts the kept rows, so
    that a resample of dropped rows alone scores 0.0, as `paper_bleu` does."""
    rows = _scored_rows(generations, references)
    kept = [i for i, row in enumerate(rows) if row is not None]
    scorer = paper_bleu_scorer()
    counts = scorer._extract_corpus_statistics([rows[i][0] for i in kept], [[rows[i][1] for i in kept]]) if kept else []
    width = len(counts[0]) if counts else 0
    statistics = np.zeros((len(rows), width + 1), dtype=np.int64)
    if kept:
        statistics[kept, :width] = counts
        statistics[kept, width] = 1

    def score_of(summed: list[int]) -> float:
        return scorer._compute_score_from_stats(summed[:-1]).score if summed[-1] else 0.0

    return statistics, score_of


METRICS.register("paper_bleu")(
    Metric(
        None,
        paper_bleu,
        raw=True,
        bleu_tokenizer=lambda: paper_bleu_scorer().tokenizer_signature,
        statistics=paper_bleu_statistics,
    )
)
