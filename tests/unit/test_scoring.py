"""The rolling windows of adafuse/methods/scoring.py: every id scored exactly once, each with as much context as
the model's positions allow, the first after the prefix id alone."""

import pytest

from adafuse.methods.scoring import rolling_windows

PREFIX = -1


@pytest.mark.parametrize("length, width", [(0, 4), (1, 4), (4, 4), (5, 4), (11, 4), (9, 1), (7, 100)])
def test_every_id_is_scored_once_with_the_most_context_that_fits(length, width):
    ids = list(range(length))
    windows = rolling_windows(ids, PREFIX, width)
    assert [t for _, targets in windows for t in targets] == ids
    sequence = [PREFIX] + ids
    for context, targets in windows:
        assert context, "an id is always scored after at least one other"
        fed = context + targets[:-1]  # what the model reads: the last target's successor is never asked
        assert len(fed) <= width
        start = sequence.index(targets[0])
        assert context == sequence[start - len(context) : start]  # the context just before the targets
        # as much as fits: it starts at the sequence's start or fills every position
        assert len(fed) == width or context[0] == PREFIX
