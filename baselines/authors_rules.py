"""The AdaFuse authors' answer rules, kept once: where their decoding loop stops and what their writer
takes as `pred` (github.com/CCM0111/AdaFuse, commit c7ecc71; line numbers are `AdaFuse_two_models.py`'s,
the rules in words: tests/fixtures/authors_code/BEHAVIOUR.md §8-§9).

Two readers share them. `method=adafuse_code` (baselines/adafuse_code.py) runs their loop and so
applies the rules to each selected span and to its own prefix (`appended_text`, `loop_pred`). The
paper's scorer replicas (eval/paper_metrics.py) read a generation their loop did not make, by any
method, as if it had (`generation_pred`). This module is plain text processing: it imports no model
code, so the scorers can use it without loading the methods.
"""

import re

_BOXED = re.compile(r"\\?boxed\s*\{", re.IGNORECASE)  # L1076
_UP_TO_BOX = re.compile(r"(.*?\\?boxed\s*\{[^}]*\})", re.IGNORECASE)  # extract_boxed_answer, L865
_CLEAN_MARKERS = r"\bquestion\s*:|\bnote\s*:|<"  # clean_text_before_question's markers, L860
_BEFORE_MARKER = re.compile(rf"(.*?)(?:{_CLEAN_MARKERS})", re.IGNORECASE)  # L860, as they search it
_AT_MARKER = re.compile(_CLEAN_MARKERS, re.IGNORECASE)
_STOP_MARKER = re.compile(r"question:|note:|<", re.IGNORECASE)  # the substrings their loop stops at, L1076
ANSWER = "Answer:"  # their writer's split point (case-sensitive), L1105


def holds_stop_marker(text: str) -> bool:
    """Their loop's stop test on a selected span (L1076): "question:" or "note:" in its lower case, or "<"."""
    return "question:" in text.lower() or "note:" in text.lower() or "<" in text


def holds_box(text: str) -> bool:
    """Their loop's other stop test (L1076): `boxed{` (a backslash and spaces before the brace allowed)."""
    return _BOXED.search(text) is not None


def before_marker(text: str) -> str:
    """`clean_text_before_question` (L860): the text before the first `question:`, `note:` (after a
    word boundary, any case, spaces before the colon allowed) or `<`, stripped. As their `re.search`
    runs it, the text kept cannot cross a newline: only the marker's own line is kept before it."""
    match = _BEFORE_MARKER.search(text)
    return match.group(1).strip() if match else text.strip()


def up_to_box(text: str) -> str:
    """`extract_boxed_answer` (L865): the text up to the first `}` after `boxed{`, stripped."""
    match = _UP_TO_BOX.search(text)
    return match.group(1).strip() if match else text.strip()


def appended_text(selected: str, eos_strings: list[str]) -> tuple[str, str | None]:
    """What their loop appends for the selected span, and why it stops after it (L1076-1102)."""
    if holds_box(selected):
        kept = up_to_box(selected)
        return (" " + kept if kept else ""), "boxed"
    if holds_stop_marker(selected):
        kept = before_marker(selected)
        return (" " + kept if kept else ""), "marker"
    return " " + selected, "eos_string" if any(e in selected for e in eos_strings) else None


def loop_pred(prompt: str, generated: str) -> str:
    """Their `pred` (L1105-1109) once their loop has generated `generated` after `prompt`: the text
    after the last "Answer:" of the whole prefix, or, where it holds none (GSM8K's prompt), the prefix
    with the prompt's first occurrence removed; stripped and cut at the first marker (`before_marker`)."""
    prefix = prompt + generated
    if ANSWER in prefix:
        return before_marker(prefix.split(ANSWER)[-1].strip())
    return before_marker(prefix.replace(prompt, "", 1).strip())


def cut_at_stop_markers(generation: str) -> str:
    """Where their loop would have stopped a generation it did not make: the text before the first
    "question:", "note:" or "<" (any case), stripped."""
    return _STOP_MARKER.split(generation, maxsplit=1)[0].strip()


def generation_pred(generation: str) -> str:
    """Their `pred` of a generation their loop did not make (any method's, read after the prompt): what
    their loop keeps (`cut_at_stop_markers`), then their writer's extraction: the text after the last
    "Answer:", cut at the first marker their stop test misses (`question :`, `note :`, a space before the
    colon), stripped. Their loop joins words with single spaces, so no newline reaches their writer: the
    cut here crosses newlines, where `before_marker` on their own prefix need not."""
    kept = cut_at_stop_markers(generation).split(ANSWER)[-1]
    return _AT_MARKER.split(kept, maxsplit=1)[0].strip()
