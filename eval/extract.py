"""Answer extractors: named `str -> str` steps that turn a raw generation into the answer a metric scores.

Like lm-evaluation-harness filters, they chain (`extract(["first_line", "strip"], text)`) and each has an
explicit fallback, so extraction never fails: when nothing matches it returns "" or the text itself.
"""

import re
from functools import reduce

from adafuse.registry import Registry

EXTRACTORS = Registry("extractor")

# A minus sign counts only when it is not a hyphen inside a word or range ("5-3", "x-1").
_NUMBER = re.compile(r"(?:(?<![\w)])-)?\$?\d[\d,]*(?:\.\d+)?")
_ANSWER_IS = re.compile(r"the answer is", re.IGNORECASE)
_BOXED_OPEN = "\\boxed{"
_HASHES = re.compile("####")


def _normalise_number(matched: str) -> str:
    """'-$1,000.50' -> '-1000.50': drop the currency sign and thousands commas, keep sign and decimals."""
    return matched.replace("$", "").replace(",", "")


def _numbers(text: str) -> list[str]:
    return [_normalise_number(m.group()) for m in _NUMBER.finditer(text)]


def _after_last(marker: re.Pattern, text: str) -> str | None:
    """The text after the last match of `marker`, or None if it does not occur."""
    matches = list(marker.finditer(text))
    return text[matches[-1].end() :] if matches else None


def _last_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}`, braces balanced (so `\\boxed{\\frac{1}{2}}` is kept whole)."""
    start = text.rfind(_BOXED_OPEN)
    if start < 0:
        return None
    depth = 0
    for at in range(start + len(_BOXED_OPEN) - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return text[start + len(_BOXED_OPEN) : at]
    return None  # an unclosed box, e.g. a generation cut by the token limit


@EXTRACTORS.register("first_line")
def first_line(text: str) -> str:
    """The first non-empty line, stripped; "" if there is none."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


@EXTRACTORS.register("strip")
def strip(text: str) -> str:
    return text.strip()


@EXTRACTORS.register("last_number")
def last_number(text: str) -> str:
    """The last number in the text, normalised ("1,000" -> "1000", "$18.50." -> "18.50"); "" if none."""
    numbers = _numbers(text)
    return numbers[-1] if numbers else ""


@EXTRACTORS.register("answer_number")
def answer_number(text: str) -> str:
    """GSM8K's final answer, from the first source that holds a number, in this order:

    the first number after the last "the answer is" (any case); the last number inside the last
    `\\boxed{...}`; the first number after the last "####"; the last number anywhere. "" if none.
    """
    after_phrase = _after_last(_ANSWER_IS, text)
    if after_phrase is not None and (numbers := _numbers(after_phrase)):
        return numbers[0]
    boxed = _last_boxed(text)
    if boxed is not None and (numbers := _numbers(boxed)):
        return numbers[-1]
    after_hashes = _after_last(_HASHES, text)
    if after_hashes is not None and (numbers := _numbers(after_hashes)):
        return numbers[0]
    return last_number(text)


def extract(chain: list[str], text: str) -> str:
    """Apply the named extractors left to right; an empty chain returns the text unchanged."""
    return reduce(lambda current, name: EXTRACTORS[name](current), chain, text)
