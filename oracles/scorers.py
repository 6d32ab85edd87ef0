"""Hand-written re-implementations of the harness's extractors and scorers, for the end-to-end tests.

Nothing here imports eval/: the tests recompute every metric from the raw `prediction` that a run wrote
(predictions.jsonl) and compare with its metrics.json, so a scorer or extractor that goes wrong (one that
returns 0, say) shows as a difference wherever the right value is not 0. Only sacrebleu is shared, as the
reference implementation of BLEU and chrF.

The paper's lenient QA scorers convert number words with word2number; this file does not re-implement that:
`lenient_em` returns None (undecided) for an example where a number word or a non-digit number could decide,
and the tests compare only the decided examples.
"""

import re
import string
import unicodedata
from collections import Counter

from sacrebleu.metrics import BLEU, CHRF

# --- extraction ----------------------------------------------------------------------------------------------


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


_NUM = re.compile(r"(?:(?<![\w)])-)?\$?\d[\d,]*(?:\.\d+)?")


def numbers_in(text: str) -> list[str]:
    return [m.replace("$", "").replace(",", "") for m in _NUM.findall(text)]


def last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, body = 1, start + len("\\boxed{")
    for at in range(body, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return text[body:at]
    return None


def gsm_answer(text: str) -> str:
    """GSM8K's answer: first number after the last "the answer is", else the last in the last \\boxed{},
    else the first after the last "####", else the last number; "" if none."""
    lower = text.lower()
    if (at := lower.rfind("the answer is")) >= 0 and (found := numbers_in(text[at + len("the answer is") :])):
        return found[0]
    if (boxed := last_boxed(text)) is not None and (found := numbers_in(boxed)):
        return found[-1]
    if (at := text.rfind("####")) >= 0 and (found := numbers_in(text[at + 4 :])):
        return found[0]
    found = numbers_in(text)
    return found[-1] if found else ""


EXTRACT = {"first_line": first_line, "strip": str.strip, "answer_number": gsm_answer}


def extracted(chain: list[str], text: str) -> str:
    for name in chain:
        text = EXTRACT[name](text)
    return text


# --- standard scores -----------------------------------------------------------------------------------------


def squad_normal(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def em(answer: str, golds: list[str]) -> float:
    return max(float(squad_normal(answer) == squad_normal(g)) for g in golds)


def _f1(pred: str, gold: str) -> float:
    p, g = squad_normal(pred).split(), squad_normal(gold).split()
    same = sum((Counter(p) & Counter(g)).values())
    return 0.0 if same == 0 else 2 * same / (len(p) + len(g))


def f1(answer: str, golds: list[str]) -> float:
    return max(_f1(answer, g) for g in golds)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def acc(answer: str, golds: list[str]) -> float:
    value = _number(answer)
    return float(value is not None and any(value == _number(g) for g in golds))


def corpus_bleu(answers: list[str], golds: list[list[str]]) -> float:
    return BLEU().corpus_score(answers, [[g[0] for g in golds]]).score


def corpus_chrf(answers: list[str], golds: list[list[str]]) -> float:
    return CHRF().corpus_score(answers, [[g[0] for g in golds]]).score


# --- the paper's lenient scores ------------------------------------------------------------------------------


def authors_cut(generation: str) -> str:
    """Before the first "question:", "note:" or "<"; after the last "Answer:"; before "question :"."""
    kept = re.split(r"question:|note:|<", generation, maxsplit=1, flags=re.IGNORECASE)[0].strip()
    kept = kept.split("Answer:")[-1]
    return re.split(r"\bquestion\s*:|\bnote\s*:", kept, maxsplit=1, flags=re.IGNORECASE)[0].strip()


NUMBER_WORDS = set(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion trillion point".split()
)
STOPWORDS = set(
    "a an the and or in on of for to with at by from about as is was were be been are has have had do does did "
    "but so if then than that which who whom whose because while where when how what why can will would should "
    "could shall may might must".split()
)
GAP = {"paper_em_nq": 1, "paper_em_squad": 5, "paper_em_trivia": 1}


def lenient_normal(text: str, variant: str) -> str:
    text = unicodedata.normalize("NFD", text)
    if variant == "paper_em_squad":
        text = re.sub(r"(\w+)'s\b", r"\1", text)
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    dropped = ("a", "an", "the") if variant == "paper_em_trivia" else STOPWORDS
    words = [w for w in text.split() if w not in dropped]
    if variant == "paper_em_nq":
        words = [w[:-1] if len(w) >= 4 and w.endswith("s") and not w.endswith("ss") else w for w in words]
    return " ".join(words)


def lenient_em(generation: str, golds: list[str], variant: str) -> float | None:
    """1.0/0.0 as the authors' QA scorer decides, or None where number words could decide."""
    pred = lenient_normal(authors_cut(generation), variant)
    verdicts = []
    for gold in golds:
        gold = lenient_normal(gold, variant)
        if pred == gold:
            return 1.0
        if pred.isdecimal() and gold.isdecimal():
            verdicts.append(int(pred) == int(gold))
            continue
        words = set(re.findall(r"[a-z]+", pred + " " + gold))
        if words & NUMBER_WORDS:
            verdicts.append(None)
            continue
        p, g = pred.split(), gold.split()
        short, long = (p, g) if len(p) <= len(g) else (g, p)
        subset = bool(p and g) and not (len(short) >= 3 and len(long) - len(short) > GAP[variant])
        verdicts.append(subset and all(w in long for w in short))
    if any(v is True for v in verdicts):
        return 1.0
    return None if None in verdicts else 0.0


def _digits(text: str) -> str:
    kept = re.sub(r"[^\d.]", "", text)
    try:
        return f"{round(float(kept), 2):.2f}"
    except ValueError:
        return kept


def paper_acc_gsm(generation: str, golds: list[str]) -> float:
    cut = authors_cut(generation)
    boxed = re.search(r"\\boxed\{([^}]+)\}", cut)
    pred = _digits(boxed.group(1).strip() if boxed else cut)
    best = 0.0
    for gold in golds:
        said = re.search(r"[Tt]he answer is\s+(.*)", gold)
        gold = _digits(said.group(1).strip() if said else gold)
        best = max(best, float(bool(pred and gold) and (pred == gold or pred in gold or gold in pred)))
    return best


def paper_bleu(generations: list[str], golds: list[list[str]]) -> float:
    rows = [(authors_cut(p), g[0].strip()) for p, g in zip(generations, golds)]
    kept = [(unicodedata.normalize("NFC", p), unicodedata.normalize("NFC", g)) for p, g in rows if p and g]
    if not kept:
        return 0.0
    return BLEU().corpus_score([p for p, _ in kept], [[g for _, g in kept]]).score


# --- a run's metrics from its records -------------------------------------------------------------------------

PER_EXAMPLE = {"em": em, "f1": f1, "acc": acc}
SENTENCE = {"bleu": BLEU(effective_order=True), "chrf": CHRF()}


def recompute(metrics: dict[str, str], chain: list[str], records: list[dict]) -> tuple[dict, dict]:
    """(corpus, per_example) from raw predictions: corpus[reported] is the metric on the 0-100 scale (None
    where some lenient verdict is undecided); per_example[reported][i] is example i's score (None: undecided;
    the key is absent for corpus-only metrics)."""
    golds = [r["references"] for r in records]
    raw = [r["prediction"] for r in records]
    answers = [extracted(chain, p) for p in raw]
    corpus, per = {}, {}
    for reported, key in metrics.items():
        if key in PER_EXAMPLE:
            per[reported] = [PER_EXAMPLE[key](a, g) for a, g in zip(answers, golds)]
        elif key in GAP:
            per[reported] = [lenient_em(p, g, key) for p, g in zip(raw, golds)]
        elif key == "paper_acc_gsm":
            per[reported] = [paper_acc_gsm(p, g) for p, g in zip(raw, golds)]
        elif key in SENTENCE:
            per[reported] = [SENTENCE[key].sentence_score(a, g).score for a, g in zip(answers, golds)]  # 0-100
            corpus[reported] = (corpus_bleu if key == "bleu" else corpus_chrf)(answers, golds)
            continue
        elif key == "paper_bleu":
            corpus[reported] = paper_bleu(raw, golds)
            continue
        elif key == "spbleu":  # needs the flores101 SentencePiece model, which no test machine has
            continue
        else:
            raise KeyError(f"no independent re-implementation of metric {key!r}")
        scores = per[reported]
        corpus[reported] = None if None in scores else 100 * sum(scores) / len(scores)
    return corpus, per
