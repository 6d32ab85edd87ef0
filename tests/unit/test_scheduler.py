"""The scheduler's planning on plain data (adafuse/engine/scheduler.py `plan_step`): which waiting requests meet in
which pass, in which order, where a prompt's shared prefix is read, and where memory splits a pass. No model is
loaded."""

import pytest

from adafuse.backend import ALONE, MERGED, PREFIX, PROMPT
from adafuse.engine.scheduler import PassPlan, RequestShape, pass_bytes, plan_step
from adafuse.errors import BatchMemoryError

KV_BYTES, LAYERS, VOCAB = 100, 4, 10  # per token of cache over all layers; layers; logit columns
BIG = 1 << 40


def step(place: int, weights: int = 1, rows: int = 1, cached: int = 20, width: int = 1, **shape):
    fields = {"mergeable": True, "last_only": False, **shape}
    return RequestShape(
        place, f"model{weights}", weights, False, None, fields["mergeable"], rows, cached, width,
        fields["last_only"], KV_BYTES, LAYERS, VOCAB,
    )  # fmt: skip


def prompt(place: int, weights: int = 1, length: int = 30, shared: int = 0, stored: bool = True):
    prefix = None if stored or not shared else tuple(range(shared))
    return RequestShape(
        place, f"model{weights}", weights, True, prefix, shared > 0, 1, shared, length - shared, True,
        KV_BYTES, LAYERS, VOCAB,
    )  # fmt: skip


def budget(limit: int):
    return lambda weights: limit


def test_prompts_without_a_prefix_come_first_one_pass_each_then_one_merged_pass_per_weights_in_place_order():
    waiting = [step(3, weights=2), prompt(2), step(0, weights=1), step(4, weights=1), step(1, weights=2), prompt(5)]
    assert plan_step(waiting, budget(BIG)) == [
        PassPlan(PROMPT, (2,)),
        PassPlan(PROMPT, (5,)),
        PassPlan(MERGED, (0, 4)),
        PassPlan(MERGED, (1, 3)),
    ]


def test_a_prompt_with_a_stored_prefix_reads_its_tail_in_its_weights_merged_pass():
    waiting = [step(3, weights=2), prompt(2, shared=10), step(0), prompt(6, weights=2, shared=10), step(4)]
    assert plan_step(waiting, budget(BIG)) == [PassPlan(MERGED, (0, 2, 4)), PassPlan(MERGED, (3, 6))]


def test_a_prefix_not_stored_yet_is_read_once_first_for_every_prompt_of_its_weights_that_starts_with_it():
    """The prefix's pass is planned before any pass of the step: the prompts that start with it are then planned
    on the shape they are read with, their tails after it."""
    waiting = [prompt(1, shared=10, stored=False), prompt(0, shared=10, stored=False), step(2)]
    waiting += [prompt(3, weights=2, shared=10, stored=False)]
    assert plan_step(waiting, budget(BIG)) == [
        PassPlan(PREFIX, (0,)),
        PassPlan(PREFIX, (3,)),
        PassPlan(MERGED, (0, 1, 2)),
        PassPlan(MERGED, (3,)),
    ]


def test_a_lone_request_of_its_weights_takes_the_packed_pass_any_request_would_share():
    """So that its bits never depend on whether another example asked in the same step."""
    assert plan_step([step(1, weights=1), step(0, weights=2)], budget(BIG)) == [
        PassPlan(MERGED, (0,)),
        PassPlan(MERGED, (1,)),
    ]


def test_requests_that_may_not_share_a_pass_run_one_per_pass():
    """A request after an empty cache, or to weights whose attention cannot be split per request."""
    waiting = [step(0), step(1, mergeable=False), step(2), step(3, mergeable=False)]
    assert plan_step(waiting, budget(BIG)) == [
        PassPlan(MERGED, (0, 2)),
        PassPlan(ALONE, (1,)),
        PassPlan(ALONE, (3,)),
    ]


def test_pass_bytes_counts_new_keys_one_layer_of_attention_input_and_float32_logits_with_their_log_softmax():
    # rows x width new positions of every layer; rows x (cached + width) positions of one layer; 2 x 4 bytes a logit
    two = step(0, rows=2, cached=40, width=2)
    assert pass_bytes([two]) == 2 * 2 * KV_BYTES + 2 * 42 * KV_BYTES // LAYERS + 2 * 2 * VOCAB * 8
    tail = step(1, rows=1, cached=40, width=5, last_only=True)
    assert pass_bytes([two, tail]) == pass_bytes([two]) + 5 * KV_BYTES + 45 * KV_BYTES // LAYERS + 1 * VOCAB * 8


def test_a_merged_pass_over_the_budget_is_cut_into_chunks_that_keep_place_order():
    one = pass_bytes([step(0)])
    waiting = [step(place) for place in (4, 1, 0, 3, 2)]
    assert plan_step(waiting, budget(2 * one)) == [
        PassPlan(MERGED, (0, 1)),
        PassPlan(MERGED, (2, 3)),
        PassPlan(MERGED, (4,)),
    ]


def test_a_pass_that_cannot_fit_even_alone_is_a_named_error():
    waiting = [step(0), step(1, width=10_000)]
    with pytest.raises(BatchMemoryError, match=r"model 'model1'.*MiB"):
        plan_step(waiting, budget(2 * pass_bytes([step(0)])))


def test_a_request_alone_is_never_held_to_the_budget():
    """Only a pass that merges is measured: a request that may not share one runs as it is."""
    assert plan_step([step(0, cached=10_000, mergeable=False)], budget(1)) == [PassPlan(ALONE, (0,))]
