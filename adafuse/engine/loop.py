"""The engine loop: every example in flight is a program (adafuse/member/passes.py) suspended at the passes it waits
on; one step plans and runs them all, then advances each example. One thread, no locks, deterministic.

As vLLM's `EngineCore.step()`: schedule, execute, update. The scheduler (adafuse/engine/scheduler.py) admits the
queued examples that fit and turns what every example waits on into a plan of passes, the executor
(adafuse/engine/executor.py) has the backend run it, and each example gets its results and runs on to its next
request, or finishes; the scheduler then reads what the examples hold. A method stays per-example code in the order
of its paper; batching across examples needs nothing from it.

- Slots. `batch_size` slots, each a set of member clones (`Member.clone`: the same weights and tokenisation,
  a context of its own). An example runs in a slot; a finished example's slot takes the next one at the start
  of the next step (continuous batching), so its prompt is read beside the others' steps, where every model's
  device has room for it (`Scheduler.admits`: the KV the examples in flight hold, against the free memory).
- Order. A step's requests are listed slot by slot, each example's in the order it asked for them: a request's
  place in that list is its place in a pass's row order, so which rows meet and where each sits, and so every
  float, never depend on anything but the examples. Examples that finish in the same step are handed back in
  slot order.
- Endings. An example that fails ends the run: `close` closes every program in flight (its cleanup runs,
  nothing is left waiting) and the error is raised; so does a caller that stops iterating `decode_many`.

The unbatched API is the same loop with one example in flight (`drive`).
"""

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from adafuse.engine import heap
from adafuse.engine.executor import Executor
from adafuse.engine.scheduler import Scheduler
from adafuse.member.passes import Program

DEFAULT_BATCH_SIZE = 8  # examples in flight; the runner's and the Python API's default (docs/speed.md)


@dataclass
class Slot:
    index: int
    members: list  # this slot's member clones (None where the ensemble has no model loaded)
    key: Any = None
    program: Program | None = None
    asked: list = field(default_factory=list)  # the requests its program waits on
    listed: bool = False  # it asked with a list (answered with a list)


class Engine:
    """Examples in flight, stepped together. `submit` queues an example; each `step` admits queued examples
    into free slots, runs one round of passes for everything in flight, and returns what finished."""

    _holding = False  # it holds a freeze of what lived before its work (adafuse/engine/heap.py)

    def __init__(
        self,
        members: list,
        make: Callable[[list, Any], Program],
        batch_size: int = DEFAULT_BATCH_SIZE,
        executor: Executor | None = None,
        scheduler: Scheduler | None = None,
    ):
        """`make(slot_members, item)` is an example's program over a slot's member clones."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.make = make
        self.executor = executor or Executor()
        self.scheduler = scheduler or Scheduler()
        self.slots = [Slot(i, [None if m is None else m.clone() for m in members]) for i in range(batch_size)]
        self.queue: deque = deque()  # (key, item) waiting for a slot

    @property
    def runners(self) -> list:
        """The weights the slots' members run on, one each."""
        members = [m for m in self.slots[0].members if m is not None] if self.slots else []
        return list({id(m.runner): m.runner for m in members}.values())

    @property
    def in_flight(self) -> int:
        return sum(slot.program is not None for slot in self.slots)

    @property
    def busy(self) -> bool:
        """Is anything in flight or queued?"""
        return bool(self.queue) or self.in_flight > 0

    @property
    def has_room(self) -> bool:
        """Would an example submitted now start at the next step?"""
        return len(self.queue) + self.in_flight < len(self.slots)

    def submit(self, key, item) -> None:
        """Queue an example: `make(slot_members, item)` runs in the first free slot; `step` returns (key, result)."""
        self.queue.append((key, item))

    def cancel(self, key) -> bool:
        """Drop the example `key` (queued or in flight) without a result; False if it is not here."""
        for i, (queued, _) in enumerate(self.queue):
            if queued == key:
                del self.queue[i]
                return True
        for slot in self.slots:
            if slot.program is not None and slot.key == key:
                self._free(slot)
                return True
        return False

    def step(self) -> list[tuple[Any, Any]]:
        """Admit queued examples, run every pass the examples in flight wait on, advance them: (key, result)
        of each example that finished, in slot order. From a step with work to the end of the work, what lived
        before it is frozen (adafuse/engine/heap.py)."""
        if not self._holding:
            heap.hold()
            self._holding = True
        finished: list[tuple[int, Any, Any]] = []
        for slot in self.slots:
            if slot.program is None and self.queue and self.scheduler.admits(self.runners, self.in_flight):
                slot.key, item = self.queue.popleft()
                slot.program = self.make(slot.members, item)
                self._advance(slot, None, finished)
        waiting = [slot for slot in self.slots if slot.program is not None]
        requests = [r for slot in waiting for r in slot.asked]  # a request's place: its index here
        results = []
        if requests:
            plans = self.scheduler.schedule(requests)  # the passes, as data (adafuse/engine/scheduler.py)
            results = self.executor.run(plans, requests)
            self.scheduler.update(requests, len(waiting))
        at = 0
        for slot in waiting:
            mine = results[at : at + len(slot.asked)]
            at += len(slot.asked)
            self._advance(slot, mine if slot.listed else mine[0], finished)
        if not self.busy:
            self._let_go()
        return [(key, result) for _, key, result in sorted(finished, key=lambda f: f[0])]

    def _advance(self, slot: Slot, value, finished: list) -> None:
        """Send the program its results and run it to its next requests (an empty list is answered at once)."""
        while True:
            try:
                asked = slot.program.send(value)
            except StopIteration as done:
                finished.append((slot.index, slot.key, done.value))
                self._free(slot)
                return
            slot.listed = isinstance(asked, list)
            slot.asked = asked if slot.listed else [asked]
            if slot.asked:
                return
            value = []

    def _free(self, slot: Slot) -> None:
        if slot.program is not None:
            slot.program.close()
        slot.program, slot.key, slot.asked = None, None, []
        for member in filter(None, slot.members):
            member.release()

    def close(self) -> None:
        """End the run: every program in flight is closed (its cleanup runs), the queue emptied."""
        self.queue.clear()
        for slot in self.slots:
            self._free(slot)
        self._let_go()

    def _let_go(self) -> None:
        if self._holding:
            self._holding = False
            heap.release()

    def __del__(self):  # an engine dropped with work left (its caller neither finished nor closed it)
        self._let_go()

    def report(self) -> dict[str, dict]:
        """Per model name, how its passes ran, their counts (the executor's) and its KV (the scheduler's): what a
        run records as its batching (metrics.json)."""
        kv = self.scheduler.report()
        return {name: passes | kv.get(name, {}) for name, passes in self.executor.report().items()}


def decode_many(
    members: list,
    items: Iterable,
    make: Callable[[list, Any], Program],
    batch_size: int = DEFAULT_BATCH_SIZE,
    executor: Executor | None = None,
    scheduler: Scheduler | None = None,
) -> Iterator[tuple[Any, Any]]:
    """Decode `items` with up to `batch_size` in flight: (item, result of `make(slot_members, item)`) as each
    finishes. An item is taken from `items` only when a slot is free for it. An example that fails ends the
    run and its error is raised here; a caller that stops iterating ends it too; either way no program is
    left in flight."""
    return run_engine(Engine(members, make, batch_size, executor, scheduler), items)


def run_engine(engine: Engine, items: Iterable) -> Iterator[tuple[Any, Any]]:
    """`decode_many` over an engine of the caller's (whose `report` the caller reads)."""
    source = iter(items)
    try:
        while True:
            while engine.has_room and (item := next(source, _END)) is not _END:
                engine.submit(item, item)
            if not engine.busy:
                return
            yield from engine.step()
    finally:
        engine.close()


def drive(program: Program, executor: Executor | None = None, scheduler: Scheduler | None = None):
    """Run one program to its end: the engine loop with it alone in flight, over the members it was made
    with (no slot clones). Its result."""
    ((_, result),) = decode_many([], [program], lambda _, given: given, 1, executor, scheduler)
    return result


_END = object()
