"""The authors' text rules as `method=adafuse_code` writes them (baselines/adafuse_code.py, and their
answer rules in baselines/authors_rules.py), on literal inputs; cases the recordings of their code never
reach (boxed answers, NaN scores, an eos string) included. Line numbers are AdaFuse_two_models.py's."""

import math
from types import SimpleNamespace

import pytest

from baselines.adafuse_code import CodeSpan, acceptable, build_code_pool, first_word, fuse, trim
from baselines.authors_rules import appended_text, generation_pred, loop_pred

NQ_PROMPT = "Question: who sang it\nAnswer: Prince\n\nQuestion: when was the last time anyone was on the moon\nAnswer:"
GSM_PROMPT = "Question: 2 + 2?\nLet's think step by step\n2 + 2 = 4.\n\nQuestion: 3 + 4?\nLet's think step by step\n"


def member(pieces: dict[int, str]):
    """A stand-in member that decodes each id to a fixed piece."""
    return SimpleNamespace(tokenisation=SimpleNamespace(decode=lambda ids: "".join(pieces[i] for i in ids)))


@pytest.mark.parametrize(
    "raw, span_length, word",
    [
        (" 1969\n\nQuestion:", 1, "1969"),
        (", and the", 1, "and"),  # pure-punctuation chunks are skipped for the first word (L247)
        (" Paris, France", 1, "Paris,"),  # punctuation stays attached
        (" – Berlin", 1, "–"),  # Unicode punctuation is not in string.punctuation
        (" , .", 1, ","),  # all punctuation: the first chunk anyway
        ("\n\n", 1, ""),
        (" New York City\nQuestion", 2, "New York"),
    ],
)
def test_the_first_word_slot(raw, span_length, word):
    assert first_word(raw, span_length) == word


def test_acceptable_texts_are_not_blank_nor_all_punctuation():
    assert acceptable("Paris") and acceptable(". ,")  # a space is not punctuation (their check, L264)
    assert not acceptable("") and not acceptable(" ") and not acceptable("?!")


def test_trim_keeps_the_shortest_prefix_that_decodes_to_the_word():
    m = member({0: " ", 1: "1", 2: "9", 3: "6", 4: "\n", 5: ",", 6: " and", 7: " the", 8: "Par", 9: "is,"})
    assert trim(m, [0, 1, 2, 3, 2, 4], "1969") == [0, 1, 2, 3, 2]  # the blank first token is kept
    assert trim(m, [5, 6, 7], "and") == [5, 6, 7]  # no prefix decodes to it: all ids
    assert trim(m, [8, 9], "Paris") == [8]  # "Paris," runs past the word: the prefix before it
    assert trim(m, [1, 2], "") == [1, 2]


@pytest.mark.parametrize(
    "selected, appended, stop",
    [
        ("Paris", " Paris", None),
        ("Bryant Question: who", " Bryant", "marker"),
        ("Question:", "", "marker"),
        ("note: x", "", "marker"),
        ("is 4<eos>", " is 4", "marker"),  # a decoded special token stops the loop through its "<"
        ("xQuestion: y", " xQuestion: y", "marker"),  # their cut needs a word boundary, their stop test does not
        ("so \\boxed{4} and", " so \\boxed{4}", "boxed"),
        ("\\boxed{4", " \\boxed{4", "boxed"),  # no closing brace: all of it
        ("end</s>", " end", "marker"),
        ("finEOS", " finEOS", "eos_string"),
    ],
)
def test_what_their_loop_appends_and_why_it_stops(selected, appended, stop):
    assert appended_text(selected, ["EOS"]) == (appended, stop)


def test_pred_is_after_the_last_answer_or_the_whole_generation():
    assert loop_pred(NQ_PROMPT, " 1969") == "1969"
    assert loop_pred(NQ_PROMPT, " x Answer: y Question: z") == "y"  # a generated "Answer:" moves the split
    assert loop_pred(GSM_PROMPT, " 3 + 4 = 7. note: done") == "3 + 4 = 7."  # no "Answer:" in a GSM8K prompt


@pytest.mark.parametrize("generated", [" 1969", " x Answer: y", " Paris. Note : a guess", " so \\boxed{4}"])
def test_the_scorers_read_the_pred_of_their_loop_from_its_text(generated):
    # what the paper_* scorers extract from adafuse_code's G is what their writer extracted
    assert generation_pred(generated) == loop_pred(NQ_PROMPT, generated)
    assert generation_pred(generated) == loop_pred(GSM_PROMPT, generated)


def test_their_cut_keeps_only_the_markers_line_which_their_join_never_leaves():
    # their regex does not cross a newline; a generation their loop did not make is read as joined
    assert loop_pred(NQ_PROMPT, " 3 + 4\n= 7 note : x") == "= 7"
    assert generation_pred(" 3 + 4\n= 7 note : x") == "3 + 4\n= 7"


def test_the_pool_keeps_first_insertion_order_and_a_models_later_duplicate():
    a, b, c = CodeSpan("Paris", [1], [-0.1]), CodeSpan("Paris", [2, 3], [-0.2, -0.3]), CodeSpan("Lyon", [4], [-1.0])
    pool, own = build_code_pool([[a, b], [c, CodeSpan("Paris", [9], [-0.5])]])
    assert [e.text for e in pool] == ["Paris", "Lyon"]
    assert pool[0].own_ids == [[2, 3], [9]] and pool[1].own_ids == [None, [4]]
    assert own["Paris"][0] is b


def test_fusion_leaves_out_nan_scores_and_skips_an_entry_with_none():
    pool, _ = build_code_pool([[CodeSpan("a", [1], [0.0])], [CodeSpan("b", [2], [0.0])]])
    pool[0].scores, pool[1].scores = [1.0, None], [None, None]
    fuse(pool)
    assert pool[0].fused == 1.0 and pool[1].fused is None
    pool[0].scores = [1.0, 2.0]
    fuse(pool)
    assert math.isclose(pool[0].fused, 1.5)
