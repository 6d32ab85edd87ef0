"""The planner on plain data (adafuse/engine/planner.py `plan_passes`): which waiting requests
meet in which pass, in which order, and where memory splits a pass. No model is loaded."""

import pytest

from adafuse.engine.planner import PassPlan, RequestShape, pass_bytes, plan_passes
from adafuse.errors import BatchMemoryError

KV_BYTES, VOCAB = 100, 10  # per token of cache; logit columns


def step(
    slot: int,
    weights: int = 1,
    rows: int = 1,
    cached: int = 20,
    width: int = 1,
    mergeable: bool = True,
    last_only: bool = False,
):
    return RequestShape(
        slot, f"model{weights}", weights, False, mergeable, rows, cached, width, last_only, KV_BYTES, VOCAB
    )


def prompt(slot: int, weights: int = 1, length: int = 30):
    return RequestShape(slot, f"model{weights}", weights, True, False, 1, 0, length, True, KV_BYTES, VOCAB)


def everything_merges(request: RequestShape) -> bool:
    return True


BIG = 1 << 40


def test_prompts_come_first_one_pass_each_then_one_merged_pass_per_weights_in_slot_order():
    waiting = [step(3, weights=2), prompt(2), step(0, weights=1), step(4, weights=1), step(1, weights=2), prompt(5)]
    assert plan_passes(waiting, everything_merges, BIG) == [
        PassPlan("prompt", (2,)),
        PassPlan("prompt", (5,)),
        PassPlan("merged", (0, 4)),
        PassPlan("merged", (1, 3)),
    ]


def test_merging_prompts_every_prompt_joins_its_weights_merged_pass():
    """Exact, a prompt reads its tail after its shared prefix beside the other examples' steps: no prompt pass
    is planned (a prefix not yet stored, or a prompt without one, is read alone when the pass runs)."""
    waiting = [step(3, weights=2), prompt(2), step(0), prompt(6, weights=2), step(4), step(1, weights=2), prompt(5)]
    assert plan_passes(waiting, everything_merges, BIG, merge_prompts=True) == [
        PassPlan("merged", (0, 2, 4, 5)),
        PassPlan("merged", (1, 3, 6)),
    ]


def test_merging_prompts_a_last_prompt_with_nothing_to_meet_or_on_weights_that_cannot_merge_reads_alone():
    waiting = [prompt(0, weights=1), prompt(1, weights=2), step(2, weights=2)]
    assert plan_passes(waiting, lambda r: r.weights == 1, BIG, merge_prompts=True) == [
        PassPlan("prompt", (1,)),
        PassPlan("prompt", (0,)),
        PassPlan("alone", (2,)),
    ]


def test_a_lone_request_of_its_weights_runs_alone():
    assert plan_passes([step(1, weights=1), step(0, weights=2)], everything_merges, BIG) == [
        PassPlan("alone", (0,)),
        PassPlan("alone", (1,)),
    ]


def test_requests_that_may_not_share_a_pass_run_one_per_pass():
    waiting = [step(0), step(1, mergeable=False), step(2), step(3, mergeable=False)]
    assert plan_passes(waiting, everything_merges, BIG) == [
        PassPlan("merged", (0, 2)),
        PassPlan("alone", (1,)),
        PassPlan("alone", (3,)),
    ]


def test_weights_that_cannot_merge_run_every_request_alone_and_are_asked_once_per_mergeable_request():
    asked = []

    def only_weights_1(request: RequestShape) -> bool:
        asked.append(request.slot)
        return request.weights == 1

    waiting = [step(2, weights=2), step(0, weights=2), step(1, weights=1), step(3, weights=1, mergeable=False)]
    assert plan_passes(waiting, only_weights_1, BIG) == [
        PassPlan("alone", (0,)),
        PassPlan("alone", (2,)),
        PassPlan("alone", (1,)),
        PassPlan("alone", (3,)),
    ]
    assert asked == [0, 1, 2]  # slot order; never for a request that may not share a pass, nor a prompt


def test_pass_bytes_counts_the_padded_cache_twice_and_float64_logits_at_each_request_s_own_positions():
    # 3 rows; cache padded to 40 plus 2 new positions, keys and values; logits at 2 + 2 + 1 positions.
    assert pass_bytes([step(0, rows=2, cached=40, width=2), step(1, cached=10, width=1)]) == (
        3 * 2 * 42 * KV_BYTES + 5 * VOCAB * 8
    )


def test_pass_bytes_counts_one_logits_position_per_row_of_a_request_that_reads_its_last_alone():
    tail = step(0, rows=1, cached=40, width=5, last_only=True)
    assert pass_bytes([tail, step(1, rows=2, cached=10, width=1)]) == 3 * 2 * 45 * KV_BYTES + (1 + 2) * VOCAB * 8


def test_a_merged_pass_over_the_budget_is_cut_into_chunks_that_keep_slot_order():
    one = pass_bytes([step(0)])
    waiting = [step(slot) for slot in (4, 1, 0, 3, 2)]
    assert plan_passes(waiting, everything_merges, 2 * one) == [
        PassPlan("merged", (0, 1)),
        PassPlan("merged", (2, 3)),
        PassPlan("alone", (4,)),
    ]


def test_a_pass_that_cannot_fit_even_alone_is_a_named_error():
    waiting = [step(0), step(1, cached=10_000)]
    with pytest.raises(BatchMemoryError, match=r"model 'model1'.*MiB"):
        plan_passes(waiting, everything_merges, 2 * pass_bytes([step(0)]))


def test_a_request_alone_is_never_held_to_the_budget():
    """Only a pass that merges is measured: a request that may not share one runs as it is."""
    assert plan_passes([step(0, cached=10_000, mergeable=False)], everything_merges, 1) == [PassPlan("alone", (0,))]
