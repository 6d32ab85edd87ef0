"""Batched decoding across examples: continuous batching under plain, per-example methods.

Each example in flight runs its method's ordinary `generate` in a worker thread, over a slot of
member clones (`Member.clone`) that share the weights. A member with a scheduler attached does not
run its forward passes itself: `Member._forward` hands the request to the scheduler and waits. Once
every worker is waiting (or finished), the scheduler runs all waiting requests, merging those that
go to the same weights into one padded forward pass (`model.forward_together`), and wakes the
workers. So a method is written once, in the order of its paper, and knows nothing of batching.

A finished example's slot takes the next example at once (continuous batching), and a new example
starts from the longest prefix that any slot has read (`PromptStore`), so the few-shot prefix that a
task's examples share is read once: prompts waiting in the same round are read one after another,
each from what the ones before it read. Consecutive greedy steps of the same examples (`single`, UniTE,
DeePEn) read and grow one padded cache in place (`Resident`) instead of merging their caches anew.
The scheduler waits for every worker before a pass, so which requests meet in a pass, and hence
every result, does not depend on thread timing. Workers also take turns (`Scheduler.turn`): a
tokenizer is not safe to call from two threads at once, and their Python work is serial anyway.
"""

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import psutil
import torch

from adafuse.errors import BatchMemoryError
from adafuse.model import Member, Resident, forward_together

log = logging.getLogger(__name__)


@dataclass
class Request:
    member: Member
    cache: object
    input_ids: torch.Tensor | None
    last_only: bool
    prompt: list[int] | None = None  # a prompt to read (`Member.read_prompt`) instead of input_ids
    done: threading.Event = field(default_factory=threading.Event)
    result: torch.Tensor | None = None
    error: BaseException | None = None

    @property
    def mergeable(self) -> bool:
        # Several ids read for their last logits alone stay alone: merged with others they would need
        # the logits of every position (gigabytes with a 262k vocabulary). An empty cache has no layers to pad.
        return not (self.last_only and self.input_ids.shape[1] > 1) and self.cache.get_seq_length() > 0


class Scheduler:
    """Gathers the forward requests of every example in flight and runs them in merged passes."""

    def __init__(self, memory_budget: int | None = None):
        self.lock = threading.Condition()
        self.turn = threading.Lock()  # held by the one worker that is running
        self.waiting: list[Request] = []
        self.running = 0  # workers started and not finished
        self.memory_budget = memory_budget or available_memory()
        self.passes = 0  # forward passes actually run
        self.rows = 0  # rows over those passes
        self.merged = 0  # passes that carried the requests of more than one example
        self.resident: dict[int, Resident] = {}  # per weights: the last merged pass's cache, if it may serve the next
        self.reused = 0  # merged passes that read the last one's cache in place

    def forward(self, member: Member, cache, input_ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Called by a worker: block until the scheduler has run this pass."""
        return self._wait(Request(member, cache, input_ids, last_only))

    def _wait(self, request: Request) -> torch.Tensor:
        with self.lock:
            self.waiting.append(request)
            self.lock.notify_all()
        self.turn.release()
        request.done.wait()
        self.turn.acquire()
        if request.error is not None:
            raise request.error
        return request.result

    def read_prompt(self, member: Member, ids: list[int]) -> torch.Tensor:
        """Called by a worker: block until the scheduler has read this prompt into the member's cache."""
        return self._wait(Request(member, None, None, True, prompt=ids))

    def run_waiting(self) -> None:
        """Run every waiting request: the prompts one by one, each reusing what the ones before it read
        (examples that start together share their few-shot prefix); the rest in one merged pass per
        weights, split where memory requires."""
        requests, self.waiting = self.waiting, []
        prompts = [r for r in requests if r.prompt is not None]
        for r in sorted(prompts, key=lambda r: (r.member.name, r.prompt)):  # an order independent of thread timing
            self._run([r])
        groups: dict[tuple[int, bool], list[Request]] = {}
        for r in requests:
            if r.prompt is None:
                groups.setdefault((id(r.member.model), r.mergeable), []).append(r)
        for (_, mergeable), group in groups.items():
            chunks = self._chunks(group) if mergeable else [[r] for r in group]
            for chunk in chunks:
                self._run(chunk)

    def _run(self, chunk: list[Request]) -> None:
        try:
            r = chunk[0]
            if r.prompt is not None:
                results = [r.member.read_prompt(r.prompt)]
            elif len(chunk) == 1:
                results = [r.member.forward_alone(r.cache, r.input_ids, r.last_only)]
            else:
                results = self._merged(chunk)
            for r, logits in zip(chunk, results):
                r.result = logits
        except BaseException as err:  # the workers re-raise it; the run stops with the real error
            for r in chunk:
                r.error = err
        self.passes += 1
        self.merged += len(chunk) > 1
        self.rows += sum(1 if r.prompt is not None else r.input_ids.shape[0] for r in chunk)
        for r in chunk:
            r.done.set()

    def _merged(self, chunk: list[Request]) -> list[torch.Tensor]:
        member = chunk[0].member
        resident = self.resident.pop(id(member.model), None)  # a stale one is dropped: it holds memory
        caches = [r.cache for r in chunk]
        self.reused += resident is not None and resident.holds(caches)
        committed = all(r.cache is r.member.cache for r in chunk)  # greedy steps, not forks (see Resident)
        results, stays = forward_together(member, caches, [r.input_ids for r in chunk], resident, committed)
        if stays is not None:
            self.resident[id(member.model)] = stays
        return results

    def _chunks(self, group: list[Request]) -> list[list[Request]]:
        """Split a group so that one merged pass (padded cache copies + logits) fits the memory budget."""
        chunks, current = [], []
        for r in sorted(group, key=lambda r: r.cache.get_seq_length()):  # similar lengths pad least
            if current and pass_bytes(current + [r]) > self.memory_budget:
                chunks.append(current)
                current = []
            if pass_bytes([r]) > self.memory_budget:
                raise BatchMemoryError(
                    f"model {r.member.name!r}: one example's forward pass needs about {pass_bytes([r]) >> 20} MiB, "
                    f"more than the {self.memory_budget >> 20} MiB available"
                )
            current.append(r)
        return chunks + [current]


def pass_bytes(requests: list[Request]) -> int:
    """About the memory a merged pass takes: the padded cache, the copies its requests take back, and the logits."""
    member = requests[0].member
    rows = sum(r.input_ids.shape[0] for r in requests)
    longest = max(r.cache.get_seq_length() for r in requests)
    width = max(r.input_ids.shape[1] for r in requests)
    return rows * (2 * (longest + width) * member.kv_bytes_per_token() + width * member.vocab_size * 8)


def available_memory() -> int:
    """Most bytes a pass may take: 80% of what is free now, on the GPU if there is one."""
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free * 0.8)
    return int(psutil.virtual_memory().available * 0.8)


def decode_many(
    members: list[Member | None],
    items: Iterable,
    decode: Callable[[list[Member | None], object], object],
    batch_size: int,
    scheduler: Scheduler | None = None,
) -> Iterator[tuple[object, object]]:
    """Decode `items` with up to `batch_size` in flight; yields (item, decode(slot_members, item)) as each finishes.

    `decode` is called in a worker thread with a slot's member clones (None stays None: a model the
    method does not use). An exception in a worker stops the run and is raised here.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    scheduler = scheduler or Scheduler()
    queue = iter(items)
    free = [[None if m is None else attach(m.clone(), scheduler) for m in members] for _ in range(batch_size)]
    finished: list[tuple[object, object, list, BaseException | None]] = []

    def work(item, slot):
        outcome, error = None, None
        scheduler.turn.acquire()
        try:
            outcome = decode(slot, item)
        except BaseException as err:
            error = err
        for member in filter(None, slot):
            member.release()
        scheduler.turn.release()
        with scheduler.lock:
            finished.append((item, outcome, slot, error))
            scheduler.running -= 1
            scheduler.lock.notify_all()

    def start_next() -> bool:
        item = next(queue, _END)
        if item is _END:
            return False
        with scheduler.lock:
            scheduler.running += 1
        threading.Thread(target=work, args=(item, free.pop()), daemon=True).start()
        return True

    while True:
        while free and start_next():
            pass
        with scheduler.lock:
            if not scheduler.running and not finished:
                return
            scheduler.lock.wait_for(lambda: finished or len(scheduler.waiting) == scheduler.running)
            done, finished[:] = list(finished), []
            if not done:  # every worker waits for a pass
                scheduler.run_waiting()
                continue
        for item, outcome, slot, error in done:
            if error is not None:
                raise error
            free.append(slot)
            yield item, outcome


def attach(member: Member, scheduler: Scheduler) -> Member:
    member.scheduler = scheduler
    return member


_END = object()
