"""The engine loop (adafuse/engine/loop.py) and `together` (adafuse/member/passes.py) on scripted programs: what
each step asks the scheduler and executor for, in which row order, what every program gets back, and how a run
ends. No model: the executor here answers each request with its own name and counts its steps; tests/engine/ runs
real ones."""

import gc
import weakref

import pytest

from adafuse.engine.loop import Engine, decode_many, drive
from adafuse.member.passes import together


class Recording:
    """A scheduler and executor in one that plans one pass of every request, answers every request with (request,
    step) and records each step's requests in row order (a request's place is its index) and how many examples were
    in flight."""

    def __init__(self):
        self.steps: list[list[str]] = []
        self.in_flight: list[int] = []

    def admits(self, runners, in_flight):
        return True

    def schedule(self, requests):
        return [("one pass", len(requests))]

    def run(self, plans, requests):
        assert plans == [("one pass", len(requests))]  # the plan the scheduler made for these requests
        self.steps.append(list(requests))
        return [(request, len(self.steps)) for request in requests]

    def update(self, requests, examples):
        self.in_flight.append(examples)


class Clone:
    runner = "the weights"

    def __init__(self):
        self.released = 0

    def clone(self):
        return Clone()

    def release(self):
        self.released += 1


def asks(name: str, times: int, log: list | None = None):
    """A program that asks for `times` passes named name:0, name:1, ... and returns what it got."""
    got = []
    try:
        for i in range(times):
            got.append((yield f"{name}:{i}"))
    finally:
        if log is not None:
            log.append(name)
    return got


def test_together_asks_for_every_program_s_next_pass_in_one_step_and_returns_in_order():
    executor = Recording()
    got = drive(together([asks("a", 2), asks("b", 3), asks("c", 0)]), executor, executor)
    assert executor.steps == [["a:0", "b:0"], ["a:1", "b:1"], ["b:2"]]
    assert got == [[("a:0", 1), ("a:1", 2)], [("b:0", 1), ("b:1", 2), ("b:2", 3)], []]


def test_a_program_that_asks_with_a_list_gets_a_list_and_one_that_asks_for_one_gets_one():
    def both():
        first = yield ["x", "y"]
        second = yield "z"
        empty = yield []  # answered at once, without a pass
        return first, second, empty

    executor = Recording()
    assert drive(both(), executor, executor) == ([("x", 1), ("y", 1)], ("z", 2), [])
    assert len(executor.steps) == 2


def test_a_failing_program_in_together_closes_the_others_and_its_error_is_raised():
    closed = []

    def failing():
        yield "f:0"
        raise ValueError("this program fails")

    with pytest.raises(ValueError, match="this program fails"):
        recording = Recording()
        drive(together([asks("a", 5, closed), failing(), asks("b", 5, closed)]), recording, recording)
    assert sorted(closed) == ["a", "b"]  # their cleanup ran: nothing is left waiting


def test_examples_step_together_in_slot_order_and_slots_are_refilled_at_the_next_step():
    executor, members = Recording(), [Clone(), None]
    lengths = {"p": 1, "q": 3, "r": 2}
    done = list(
        decode_many(members, list(lengths), lambda slot, name: asks(name, lengths[name]), 2, executor, executor)
    )
    assert [key for key, _ in done] == ["p", "r", "q"]  # r and q end in the same step: in slot order
    # step 1: p and q; p finishes, so r takes slot 0 at step 2, beside q: slot 0's requests come first
    assert executor.steps[:2] == [["p:0", "q:0"], ["r:0", "q:1"]]
    assert executor.in_flight == [2, 2, 2]


def test_a_failing_example_ends_the_run_closing_every_program_in_flight():
    closed = []

    def make(slot, name):
        if name == "bad":
            return iter_failing()
        return asks(name, 10, closed)

    def iter_failing():
        yield "bad:0"
        raise RuntimeError("example failed")

    with pytest.raises(RuntimeError, match="example failed"):
        recording = Recording()
        list(decode_many([Clone()], ["a", "bad", "b"], make, 3, recording, recording))
    assert sorted(closed) == ["a", "b"]


def test_a_caller_that_stops_iterating_closes_every_program_in_flight():
    closed, members = [], [Clone()]
    stream = decode_many(
        members,
        ["short", "long"],
        lambda slot, name: asks(name, 1 if name == "short" else 9, closed),
        2,
        *[Recording()] * 2,
    )
    assert next(stream)[0] == "short"
    stream.close()
    assert sorted(closed) == ["long", "short"]


def test_a_cancelled_example_is_closed_and_its_slot_taken_by_the_next():
    closed = []
    recording = Recording()
    engine = Engine(
        [Clone()], lambda slot, name: asks(name, 3, closed), batch_size=1, executor=recording, scheduler=recording
    )
    engine.submit("a", "a")
    engine.submit("b", "b")
    engine.step()
    assert engine.cancel("a") and closed == ["a"] and engine.cancel("missing") is False
    finished = []
    while engine.busy:
        finished += engine.step()
    assert [key for key, _ in finished] == ["b"]
    assert engine.slots[0].members[0].released == 2  # after each example, its slot's context is dropped


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


def test_what_lives_when_an_engine_starts_on_its_work_is_frozen_until_it_is_done_and_what_it_makes_is_collected():
    """adafuse/engine/heap.py: while an engine has work the collector skips what was alive at its first step with
    work (engines at work at once, one run inside another's step, share the freeze), but collects a cycle the work made
    and let go a step later; once the last engine's work is done, failed or not, the frozen objects' cycles are
    collected too."""
    gc.collect()
    assert gc.get_freeze_count() == 0
    before = weakref.ref(made := Cycle())
    seen = {}

    def program():
        nonlocal made
        made = None
        gc.collect()
        seen["made before the work and let go in it: kept"] = before() is not None
        during = Cycle()
        of_the_work = weakref.ref(during)
        yield "step 1"
        del during  # a step after it was made
        yield "step 2"
        gc.collect()
        seen["made in the work and let go in it: collected"] = of_the_work() is None
        drive(asks("inner", 1), *[Recording()] * 2)  # a run inside this run's step
        seen["frozen after a run inside ended"] = gc.get_freeze_count() > 0
        return "done"

    def make(slot, name):
        return program() if name == "program" else asks(name, 1 if name == "short" else 9)

    first = decode_many([Clone()], ["program", "long"], make, 2, *[Recording()] * 2)
    second = decode_many([Clone()], ["short", "long"], make, 2, *[Recording()] * 2)
    assert next(first)[0] == "program" and next(second)[0] == "short"  # each has its "long" left: both at work
    assert seen == dict.fromkeys(seen, True) and len(seen) == 3
    assert len(list(first)) == 1 and gc.get_freeze_count() > 0  # the other is still at work
    assert len(list(second)) == 1 and gc.get_freeze_count() == 0
    gc.collect()
    assert before() is None

    def failing(slot, name):
        raise RuntimeError("example failed")

    with pytest.raises(RuntimeError, match="example failed"):
        list(decode_many([Clone()], ["a"], failing, 1, *[Recording()] * 2))
    assert gc.get_freeze_count() == 0


def test_an_engine_stepped_by_hand_holds_the_freeze_while_it_has_work_closed_or_dropped_it_lets_go():
    """As the server steps its engine: frozen from a step with work until nothing is in flight or queued; an engine
    closed, or dropped, with work left lets go of it too."""
    recording = Recording()
    engine = Engine([Clone()], lambda slot, name: asks(name, 2), 1, recording, recording)
    engine.submit("a", "a")
    assert gc.get_freeze_count() == 0
    engine.step()
    assert gc.get_freeze_count() > 0
    engine.step()
    engine.step()  # "a" ends
    assert not engine.busy and gc.get_freeze_count() == 0
    engine.submit("b", "b")
    engine.step()
    engine.close()
    assert gc.get_freeze_count() == 0
    engine.submit("c", "c")
    engine.step()
    assert gc.get_freeze_count() > 0
    del engine
    assert gc.get_freeze_count() == 0
