"""Pure pieces of the decoding rules: margin, ties, stop strings, settings."""

import math

import pytest
import torch

from adafuse.config import AdaFuseConfig, ModelConfig, SingleConfig
from adafuse.errors import ConfigError, UnknownNameError
from adafuse.methods.adafuse import margin
from adafuse.methods.pool import choose_winner
from adafuse.methods.stopping import cut_at_stop, settled_cut, stop_strings
from adafuse.registry import Registry
from adafuse.text.align import common_prefix


def test_margin_is_top1_minus_top2_probability():
    probs = torch.tensor([0.1, 0.6, 0.25, 0.05])
    assert margin(probs.log()) == pytest.approx(0.35)


def test_margin_uses_the_full_vocabulary_softmax():
    logits = torch.zeros(1000)
    logits[0] = 5.0
    p = torch.softmax(logits, -1)
    assert margin(torch.log_softmax(logits, -1)) == pytest.approx((p[0] - p[1]).item())


def test_ties_go_to_the_earliest_candidate():
    assert choose_winner([0.5, 0.2, 0.2, 0.9]) == 1
    assert choose_winner([0.3, 0.3]) == 0
    assert choose_winner([1.0]) == 0


@pytest.mark.parametrize(
    "text, new, stop, expected",
    [
        ("", " Paris\n\nQuestion:", ["\n"], (" Paris", True)),
        (" Paris", " is", ["\n"], (" Paris is", False)),
        (" The answer is \\box", "ed{4} done", ["ed{4}"], (" The answer is \\box", True)),  # straddles rounds
        ("a", "bQ: x Question:", ["Question:", "Q:"], ("ab", True)),  # the earliest stop wins
        ("", "no stop", [], ("no stop", False)),
    ],
)
def test_cut_at_stop(text, new, stop, expected):
    assert cut_at_stop(text, new, tuple(stop)) == expected


@pytest.mark.parametrize(
    "text, new, stop, final, expected",
    [
        (" Paris", "\nQ", ("\n",), False, " Paris"),  # whatever follows, G is cut at the newline
        (" Paris", ",", ("\n",), False, None),  # no stop yet
        (" Paris", ",", ("\n",), True, None),  # a complete candidate without a stop never settles
        ("", "\n", ("\n\n",), False, None),  # a stop string begun, not complete
        ("A\n", "\nB", ("\n\n",), True, "A"),  # a stop straddling G and the candidate
        ("", "xY", ("XYZ", "Y"), False, "x"),  # "x" cannot start "XYZ": settled at "Y"
        ("", "XY", ("XYZ", "Y"), False, None),  # a "Z" next would cut one character earlier
        ("", "XY", ("XYZ", "Y"), True, "X"),  # complete: nothing comes next
        ("", "XYW", ("XYZ", "Y"), False, "X"),  # "XYW" rules "XYZ" out
        ("", " a\n\nQuestion:", ("\n", "\n\nQuestion:"), False, " a"),  # the earliest stop, both found
    ],
)
def test_settled_cut_is_the_cut_no_continuation_can_change(text, new, stop, final, expected):
    assert settled_cut(text, new, stop, final) == expected
    if expected is not None:
        for more in ["", "Z", "\n", "YZ"] if not final else [""]:
            assert cut_at_stop(text, new + more, stop) == (expected, True)


def test_one_stop_string_is_not_split_into_characters_and_an_empty_one_is_refused():
    assert stop_strings("\n\nQuestion:") == ("\n\nQuestion:",)
    assert stop_strings(["\n", "Q:"]) == ("\n", "Q:")
    assert stop_strings(None) == ()
    with pytest.raises(ConfigError, match="empty stop string"):
        stop_strings(["\n", ""])


@pytest.mark.parametrize(
    "bad",
    [
        dict(tau=-0.1),
        dict(tau=math.nan),
        dict(branches=0),
        dict(max_words=0),
        dict(max_word_tokens=0),
        dict(fixed_words=0),
    ],
)
def test_out_of_range_settings_are_rejected(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        AdaFuseConfig(**bad)


def test_tau_above_one_is_valid_and_means_never_confident():
    assert AdaFuseConfig(tau=1.5).tau == 1.5


def test_model_entry_needs_exactly_one_source():
    with pytest.raises(ConfigError, match="set one of `path` or `bundle`"):
        ModelConfig(name="x")
    with pytest.raises(ConfigError, match="both path 'a/b' and bundle 'smollm2_135m' are set"):
        ModelConfig(name="x", path="a/b", bundle="smollm2_135m")
    with pytest.raises(ConfigError, match="dtype"):
        ModelConfig(name="x", path="a/b", dtype="float8")
    with pytest.raises(ConfigError, match="member"):
        SingleConfig(member=-1)


def test_registry_miss_lists_close_matches_and_all_choices():
    reg = Registry("task")
    reg.register("nq")(1)
    reg.register("squad")(2)
    with pytest.raises(UnknownNameError) as err:
        reg["sqaud"]
    assert "Did you mean 'squad'" in str(err.value)
    assert "nq, squad" in str(err.value)


@pytest.mark.parametrize(
    "a, b, length",
    [
        ([], [], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2, 3], [1, 9, 3], 1),
        ([5], [6], 0),
        (list(range(1000)), list(range(999)) + [7], 999),
        (list(range(1000)), [0, 1, 2, 8], 3),
    ],
)
def test_common_prefix(a, b, length):
    assert common_prefix(a, b) == common_prefix(b, a) == length
