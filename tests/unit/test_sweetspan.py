"""SweetSpan's score fusion on literal lists: the outlier filter, normalisation, and the knobs' ranges."""

import math

import pytest

from adafuse.errors import ConfigError
from baselines.sweetspan import SweetSpanConfig, fused_scores, kept_by_filter, normalized


@pytest.mark.parametrize(
    "scores, kept",
    [
        ([1.0, 2.0], [0, 1]),  # ratio 2 <= 10: all count
        ([1.0, 10.0], [0, 1]),  # exactly λ is not an outlier
        ([1.0, 10.5], [0]),  # two scores: only the largest goes
        ([12.0, 1.0], [1]),
        ([1.0, 5.0, 20.0], [1]),  # three: the largest and the smallest go, the median stays
        ([20.0, 5.0, 1.0, 3.0], [1, 3]),
        ([0.0, 0.0], [0, 1]),  # no spread at all
        ([0.0, 0.3], [0]),  # a zero NLL: any positive score is beyond λ times it
        ([2.0, 2.0, 2.0], [0, 1, 2]),
        ([5.0], [0]),
    ],
)
def test_outlier_filter(scores, kept):
    assert kept_by_filter(scores, 10.0) == kept


def test_outlier_filter_drops_one_of_equal_extremes():
    assert kept_by_filter([30.0, 1.0, 30.0, 1.0], 10.0) == [2, 3]


def test_fused_score_is_the_mean_of_the_kept_scores():
    nll = [[1.0, 2.0], [1.0, 30.0], [4.0, 2.0]]
    fused, kept = fused_scores(nll, SweetSpanConfig())
    assert kept == [[0, 1], [0], [0, 1]]
    assert fused == pytest.approx([1.5, 1.0, 3.0])
    fused, kept = fused_scores(nll, SweetSpanConfig(outlier_ratio=math.inf))  # the filter off
    assert fused == pytest.approx([1.5, 15.5, 3.0]) and kept == [[0, 1]] * 3


def test_normalisation_divides_each_evaluator_by_its_mean_over_the_pool():
    nll = [[1.0, 10.0], [3.0, 30.0]]  # evaluator 1 has ten times evaluator 0's scale
    assert normalized(nll) == [[0.5, 0.5], [1.5, 1.5]]
    assert normalized([[0.0, 2.0], [0.0, 2.0]]) == [[0.0, 1.0], [0.0, 1.0]]  # a zero mean stays zero
    # with the scales equalised no score is an outlier any more, and the order can change:
    nll = [[0.2, 9.0], [1.0, 1.0]]  # raw: span 0 keeps only 0.2 (9 > 10 * 0.2) and wins
    assert fused_scores(nll, SweetSpanConfig())[0] == pytest.approx([0.2, 1.0])
    fused, _ = fused_scores(nll, SweetSpanConfig(normalize=True))
    assert fused == pytest.approx([(0.2 / 0.6 + 9.0 / 5.0) / 2, (1.0 / 0.6 + 1.0 / 5.0) / 2])
    assert fused[1] < fused[0]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(span_words=0), "span_words must be >= 1"),
        (dict(span_words=-3), "span_words must be >= 1"),
        (dict(outlier_ratio=1.0), "outlier_ratio"),
        (dict(outlier_ratio=0.5), "outlier_ratio"),
        (dict(outlier_ratio=math.nan), "outlier_ratio"),
        (dict(max_word_tokens=0), "max_word_tokens must be >= 1"),
    ],
)
def test_settings_that_make_no_sense_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        SweetSpanConfig(**options)


def test_defaults():
    cfg = SweetSpanConfig()
    assert (cfg.span_words, cfg.outlier_ratio, cfg.normalize, cfg.max_word_tokens) == (4, 10.0, False, 16)
    SweetSpanConfig(span_words=1, outlier_ratio=math.inf)  # valid edges
