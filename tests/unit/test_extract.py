"""Answer extractors: each rule, its precedence, and its fallback."""

import pytest

from adafuse.errors import UnknownNameError
from eval.extract import EXTRACTORS, answer_number, extract, first_line, last_number, strip


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\n\n  Paris \nLondon", "Paris"),
        ("Paris", "Paris"),
        ("   \n \t\n", ""),
        ("", ""),
    ],
)
def test_first_line_keeps_the_first_non_empty_line(text, expected):
    assert first_line(text) == expected


def test_strip_removes_surrounding_whitespace_only():
    assert strip("  Der Hund.\n") == "Der Hund."


@pytest.mark.parametrize(
    "text, expected",
    [
        ("It costs $18.50.", "18.50"),
        ("They sold 1,000 cakes", "1000"),
        ("The change is -3", "-3"),
        ("x = (-4)", "-4"),
        ("pages 10-12", "12"),  # a hyphen between numbers is not a minus sign
        ("5 apples, then 7.", "7"),
        ("no digits here", ""),
    ],
)
def test_last_number_normalises_the_last_number(text, expected):
    assert last_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She pays $18.50 for 2 bags. The answer is $1,000.", "1000"),
        ("The answer is 5. Wait, the answer is 18 apples, not 20.", "18"),  # the last phrase, its first number
        ("THE ANSWER IS 42", "42"),
        ("The answer is 7. So \\boxed{9}", "7"),  # the phrase beats the box
        ("3 + 4 = 7, so \\boxed{7} ... then \\boxed{1,234}", "1234"),  # the last box
        ("\\boxed{x = -3}", "-3"),
        ("\\boxed{\\frac{1}{2}} and 9 more", "2"),  # nested braces stay inside the box
        ("\\boxed{18}. Check: 18 - 6 = 12, so the answer is clear.", "18"),  # no number after the phrase: fall through
        ("Natalia sold 48 clips.\n#### 72", "72"),
        ("5 + 13 = 18.", "18"),
        ("I cannot tell.", ""),
    ],
)
def test_answer_number_prefers_phrase_then_box_then_hashes_then_last_number(text, expected):
    assert answer_number(text) == expected


def test_extract_chains_left_to_right():
    generation = "\n 18 apples.\nQuestion: how many 3 legged cats?"
    assert extract(["first_line", "answer_number"], generation) == "18"
    assert extract(["answer_number"], generation) == "3"  # without the cut the later number wins


def test_extract_with_an_empty_chain_returns_the_text():
    assert extract([], " raw ") == " raw "


def test_unknown_extractor_names_close_matches():
    with pytest.raises(UnknownNameError, match="last_number"):
        extract(["last_numbr"], "1")


def test_registry_holds_every_extractor():
    assert set(EXTRACTORS) == {"first_line", "strip", "answer_number", "last_number"}
