"""Batching across examples: continuous batching under plain, per-example methods.

The whole story, in the order it happens:

1. Slots. `decode_many` keeps `batch_size` slots. A slot is a set of member clones
   (`Member.clone`: the same weights and tokenizer, a context and KV cache of its own) with the
   scheduler attached and the slot's index. Each example in flight runs its method's ordinary
   per-example code in a worker thread over one slot, so a method is written once, in the order of
   its paper, and knows nothing of batching. A finished example's slot takes the next example at
   once (continuous batching).

2. Requests. A member with a scheduler attached does not run its forward passes itself:
   `Member._forward` (and `Member.start`, for a prompt) hands a `Request` to `Scheduler._wait` and
   blocks until the scheduler has run it.

3. Turns. Workers run their Python one at a time: a worker holds `Scheduler.turn` while it runs
   and releases it only while it waits for a pass (a fast tokenizer is not safe under concurrent
   calls, and the Python work is serial anyway). `Scheduler.lock` guards the shared lists:
   `waiting` (requests not yet run), `running` (workers started and not finished) and the finished
   examples.

4. Passes. The main thread (`decode_many`) waits until every running worker is waiting or some
   example has finished. When all wait, `Scheduler.run_waiting` plans the passes and then runs them,
   as vLLM's scheduler hands a schedule to its executor. `plan_passes` is plain data in, plain data
   out (`RequestShape`s in, `PassPlan`s out): the prompts first, each a pass of its own, then one
   merged forward pass per weights, split into chunks where memory requires. Exact, a prompt is read
   in its weights' merged pass instead, after its shared prefix (a slot refilled while the others
   decode: its tail costs the positions it adds, not a pass). A prompt's shared prefix (its task's
   few-shot exemplars, `Request.prefix`) is read in a pass of its own the first time, then kept
   (adafuse/cache.py `PromptStore`); a prompt without one is read whole, alone. `Scheduler.run_pass`
   runs one planned pass: a prompt, a request alone, or a merged pass (adafuse/merged_pass.py
   `forward_together`). Requests
   are taken in slot order, so which rows meet in a pass and where each row sits, and hence every
   float, never depend on which thread woke first (a GPU picks its kernels by shape).

5. The merged pass (adafuse/merged_pass.py). Position ids are each row's own. Exact (the default), the
   pass is one packed row of the requests' real positions (no padding is computed), and each request's
   attention runs over its own cache, which grows in place as in its pass alone (adafuse/cache.py
   `GrowingLayer`; adafuse/invariance.py). Not exact, inputs are right-padded to the widest, caches are
   left-padded into one buffer with room to grow (`ReservedLayer`) under one attention mask, greedy
   steps of the same examples read that buffer as it is (`Resident`), and forks copy their rows back
   out. The planner splits a pass whose padded copies and logits would not fit the memory budget
   (`pass_bytes`); one that cannot fit even alone is `BatchMemoryError`, raised while planning, before
   any pass of that round runs. An example's members run side by side (`Scheduler.concurrently`), so
   their requests wait in the same turn, and a turn runs each model's passes on a thread of its own,
   each on its share of the cores (adafuse/cores.py).

6. Endings. An exception in a worker, or a caller that stops iterating, ends the run: the scheduler
   is closed, every waiting request and every later one fails with `Cancelled`, and every worker
   thread is joined before `decode_many` returns or raises, so no thread is left waiting and no
   slot's clones and caches outlive the run.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import psutil
import torch

from adafuse.cores import CoreShare, quick_gil_handoff
from adafuse.errors import BatchMemoryError
from adafuse.merged_pass import Resident, can_merge_exactly, forward_together
from adafuse.model import Member

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 8  # examples in flight; the runner's and the Python API's default (README: Batching)


class Cancelled(RuntimeError):
    """The run ended (another example failed, or the caller stopped) before this request ran."""


@dataclass(frozen=True)
class Meeting:
    """How one model's requests from different examples meet. Each part of the layer is "merged" (one
    computation over every request's rows, not batch-invariant), "row_tiles" (linear layers: one multiply
    over every request's rows padded to fixed row tiles, bit-identical to each request alone:
    adafuse/invariance.py), "per_request" (attention: inside the merged pass, each request's rows on
    their own) or "alone" (no merged passes: each request runs its own)."""

    attention: str
    linear: str


@dataclass
class PassCounts:
    """One model's forward passes in a batched run (a prompt read is one pass of one row)."""

    passes: int = 0
    merged_passes: int = 0  # passes that carried the requests of more than one example
    rows: int = 0  # rows over all passes
    merged_prompts: int = 0  # prompts read in a merged pass, not in a pass of their own (`plan_passes`)
    # wall time its passes took, log-softmax included (on its own thread, beside the other model's passes)
    seconds: float = 0.0


@dataclass(frozen=True)
class RequestShape:
    """What the planner reads of a waiting request (plain data: `plan_passes` needs no model)."""

    slot: int
    model: str  # the member's name
    weights: int  # which weights it runs on: only requests to the same weights share a pass
    prompt: bool  # a prompt to read (`Member.read_prompt`): a pass of its own, or in a merged pass (`plan_passes`)
    mergeable: bool  # the request itself may share a pass (see `PassRequest.mergeable`)
    rows: int
    cached: int  # tokens in its cache
    width: int  # tokens it reads
    last_only: bool  # it needs the logits of its last position alone
    kv_bytes_per_token: int
    vocab_size: int


@dataclass(frozen=True)
class PassPlan:
    """One forward pass to run: "prompt" (one prompt read), "alone" (one request's pass) or "merged"
    (several requests' rows in one pass), and its requests' slots in row order."""

    kind: str
    slots: tuple[int, ...]


@dataclass
class PassRequest:
    """One forward pass a worker asks for: input ids read after a cache, or a prompt to read."""

    member: Member
    cache: object
    input_ids: torch.Tensor | None
    last_only: bool
    lengths: list[int] | None = None  # each row's real ids, the rest right padding (`Member._forward`)
    logprobs: bool = False  # hand back the member's log-softmax of the logits, taken on the pass's thread
    prompt: list[int] | None = None  # a prompt to read (`Member.read_prompt`) instead of input_ids
    shared: int = 0  # the prompt's first ids that are its shared prefix (`Member.prompt_reading`)
    done: threading.Event = field(default_factory=threading.Event)
    result: torch.Tensor | None = None
    error: BaseException | None = None

    @property
    def slot(self) -> int:
        return self.member.slot

    def alone(self) -> torch.Tensor:
        """This request's pass of its own (`Member.forward_alone`)."""
        return self.member.forward_alone(self.cache, self.input_ids, self.last_only, self.lengths)

    @property
    def mergeable(self) -> bool:
        # An empty cache has no layers to read from or pad (a prompt read from the start runs alone).
        return self.cache.get_seq_length() > 0

    @property
    def shape(self) -> RequestShape:
        member, prompt = self.member, self.prompt is not None
        return RequestShape(
            slot=self.slot,
            model=member.name,
            weights=id(member.model),
            prompt=prompt,
            mergeable=not prompt and self.mergeable,
            rows=1 if prompt else self.input_ids.shape[0],
            cached=0 if prompt else self.cache.get_seq_length(),
            width=len(self.prompt) if prompt else self.input_ids.shape[1],
            last_only=self.last_only,
            kv_bytes_per_token=member.kv_bytes_per_token(),
            vocab_size=member.vocab_size,
        )


class Scheduler:
    """Gathers the forward requests of every example in flight and runs them in merged passes."""

    def __init__(self, memory_budget: int | None = None, exact: bool = True, side_by_side: bool = True):
        self.exact = exact  # merged passes bitwise equal to each request alone (adafuse/invariance.py)
        # different models' passes of a turn run on threads of their own, side by side; False: one model's after
        # the other's, each on every core (what a model's passes cost with nothing beside them; same outputs)
        self.side_by_side = side_by_side
        self.lock = threading.Condition()
        self.turn = threading.Lock()  # held by the one worker that is running
        self.waiting: list[PassRequest] = []
        self.running = 0  # workers started and not finished
        self.closed = False  # the run has ended: every request fails with Cancelled
        self.memory_budget = memory_budget or available_memory()
        self.passes = 0  # forward passes actually run
        self.rows = 0  # rows over those passes
        self.merged = 0  # passes that carried the requests of more than one example
        self.resident: dict[int, Resident] = {}  # per weights: the last merged pass's cache, if it may serve the next
        self.reused = 0  # merged passes that read the last one's cache in place
        self.pass_slots: list[list[int]] = []  # the slots of each merged pass's requests, in row order
        self.meetings: dict[str, Meeting] = {}  # per model name: how its requests meet
        self.counts: dict[str, PassCounts] = {}  # per model name: its passes
        self.counting = threading.Lock()  # the counts above: different models' passes run side by side
        self.pool = ThreadPoolExecutor(thread_name_prefix="adafuse-pass")

    def _merges(self, member: Member) -> bool:
        """May this member's requests share a pass? With `exact`, only if the model can be split exactly."""
        if member.name not in self.meetings:
            if not self.exact:
                self.meetings[member.name] = Meeting("merged", "merged")
            elif not can_merge_exactly(member.model):
                self.meetings[member.name] = Meeting("alone", "alone")
            else:
                self.meetings[member.name] = Meeting("per_request", "row_tiles")
        return self.meetings[member.name].attention != "alone"

    def report(self) -> dict[str, dict]:
        """Per model name, how its requests met and its pass counts, as plain data (a run's metrics.json):
        {"attention": ..., "linear": ... (see `Meeting`; None before its first decoding pass),
        "passes": ..., "merged_passes": ..., "rows": ..., "merged_prompts": ..., "seconds": ...}."""
        report = {}
        for name, counts in self.counts.items():
            meeting = self.meetings.get(name)
            how = {"attention": None, "linear": None} if meeting is None else asdict(meeting)
            report[name] = how | asdict(counts)
        return report

    def forward(
        self,
        member: Member,
        cache,
        input_ids: torch.Tensor,
        last_only: bool,
        lengths: list[int] | None = None,
        logprobs: bool = False,
    ) -> torch.Tensor:
        """Called by a worker: block until the scheduler has run this pass."""
        return self._wait(PassRequest(member, cache, input_ids, last_only, lengths, logprobs))

    def read_prompt(self, member: Member, ids: list[int], shared: int = 0) -> torch.Tensor:
        """Called by a worker: block until the scheduler has read this prompt into the member's cache."""
        return self._wait(PassRequest(member, None, None, True, prompt=ids, shared=shared))

    def _wait(self, request: PassRequest) -> torch.Tensor:
        with self.lock:
            if self.closed:
                raise Cancelled("the batched run has ended")
            self.waiting.append(request)
            self.lock.notify_all()
        self.turn.release()
        request.done.wait()
        self.turn.acquire()
        if request.error is not None:
            raise request.error
        return request.result

    def concurrently(self, tasks: list[Callable[[], object]]) -> list[object]:
        """Called by a worker: run `tasks` side by side, each as a worker of its own, and return their results
        in order (the first error, in task order, is raised once all have ended). One example's members
        propose and score this way, so that their passes run in the same turn instead of one after another.

        The caller holds `turn` and gives its place among the running workers to the tasks: `running` grows
        by all but one of them, and the last task to end hands the place back instead of leaving it, so at
        no moment does a pass run while the caller is about to ask for one.
        """
        if len(tasks) < 2:
            return [task() for task in tasks]
        results: list[object] = [None] * len(tasks)
        errors: list[BaseException | None] = [None] * len(tasks)
        left = [len(tasks)]
        all_ended = threading.Event()

        def run(i: int) -> None:
            self.turn.acquire()
            try:
                results[i] = tasks[i]()
            except BaseException as err:
                errors[i] = err
            with self.lock:
                left[0] -= 1
                last = left[0] == 0
                if not last:
                    self.running -= 1
                    self.lock.notify_all()
            self.turn.release()
            if last:
                all_ended.set()

        with self.lock:
            self.running += len(tasks) - 1
        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(tasks))]
        for thread in threads:
            thread.start()
        self.turn.release()
        all_ended.wait()
        for thread in threads:
            thread.join()
        self.turn.acquire()
        for err in errors:
            if err is not None:
                raise err
        return results

    def close(self) -> None:
        """End the run: fail every waiting request (and every later one), drop the resident caches."""
        with self.lock:
            self.closed = True
            cancelled, self.waiting = self.waiting, []
            self.resident.clear()
            self.lock.notify_all()
        self.pool.shutdown(wait=False)
        for r in cancelled:
            r.error = Cancelled("the batched run has ended")
            r.done.set()

    def run_waiting(self) -> None:
        """Plan every waiting request's pass (`plan_passes`), then run the passes in plan order."""
        requests, self.waiting = sorted(self.waiting, key=lambda r: r.slot), []
        by_slot = {r.slot: r for r in requests}
        try:
            if len(by_slot) != len(requests):
                raise AssertionError(f"two waiting requests share a slot: {[r.slot for r in requests]}")
            plans = plan_passes(
                [r.shape for r in requests],
                lambda shape: self._merges(by_slot[shape.slot].member),
                self.memory_budget,
                merge_prompts=self.exact,
            )
            by_weights: dict[int, list[PassPlan]] = {}
            for plan in plans:
                member = by_slot[plan.slots[0]].member
                by_weights.setdefault(id(member.model), []).append(plan)
                self.counts.setdefault(member.name, PassCounts())  # in plan order: the report's model order

            share = CoreShare(len(by_weights) if self.side_by_side else 1)

            def run_in_order(weights_plans: list[PassPlan]) -> None:
                with share.joined():
                    for plan in weights_plans:
                        self.run_pass(plan, [by_slot[slot] for slot in plan.slots])

            if not self.side_by_side:
                for group in by_weights.values():
                    self.pool.submit(run_in_order, group).result()
                return
            # Each model's passes in plan order; different models' passes side by side (threads), so that one
            # model's Python overlaps the other's multiplies, each on its share of the cores (adafuse/cores.py).
            # No pass reads what another model's pass writes.
            with quick_gil_handoff():
                for done in [self.pool.submit(run_in_order, group) for group in by_weights.values()]:
                    done.result()
        finally:  # a round that could not be planned (BatchMemoryError) leaves no worker waiting
            for r in requests:
                if not r.done.is_set():
                    r.error = Cancelled("the batched run has ended")
                    r.done.set()

    def run_pass(self, plan: PassPlan, chunk: list[PassRequest]) -> None:
        """Run one planned pass over its requests (in the plan's slot order), hand each its logits or
        the error, and count the pass."""
        met = chunk  # the requests that shared the pass: a merged plan's prompt may be read alone first
        start = time.perf_counter()
        try:
            if plan.kind == "prompt":
                (r,) = chunk
                self._take_prompt_reading(r)
                results = [r.member.read_prompt_tail(r.prompt, r.cache, r.input_ids)]
            elif plan.kind == "alone":
                (r,) = chunk
                results = [r.alone()]
            else:
                results, met = self._merged(chunk)
            for r, logits in zip(chunk, results):
                r.result = r.member._log_softmax(logits) if r.logprobs else logits
        except BaseException as err:  # the workers re-raise it; the run stops with the real error
            for r in chunk:
                r.error = err
        with self.counting:
            if met:
                self._count(met)
            self.counts.setdefault(chunk[0].member.name, PassCounts()).seconds += time.perf_counter() - start
        for r in chunk:
            r.done.set()

    def _count(self, met: list[PassRequest]) -> None:
        """Count one pass over the requests `met` (a prompt read is one row)."""
        rows = sum(1 if r.prompt is not None else r.input_ids.shape[0] for r in met)
        merged = len(met) > 1
        self.passes += 1
        self.merged += merged
        self.rows += rows
        counts = self.counts.setdefault(met[0].member.name, PassCounts())
        counts.passes += 1
        counts.merged_passes += merged
        counts.rows += rows
        counts.merged_prompts += sum(r.prompt is not None for r in met) if merged else 0

    def _merged(self, chunk: list[PassRequest]) -> tuple[list[torch.Tensor], list[PassRequest]]:
        """The merged pass's results in chunk order, and the requests that met in it. A prompt in it (see
        `plan_passes`) reads its tail after its shared prefix (its positions join the packed pass and pad no
        other row); one without a prefix is read whole, alone, first (a pass counted of its own)."""
        alone: dict[int, torch.Tensor] = {}
        for i, r in enumerate(chunk):
            if r.prompt is not None:
                self._take_prompt_reading(r)
                if not r.mergeable:
                    alone[i] = r.member.read_prompt_tail(r.prompt, r.cache, r.input_ids)
                    with self.counting:
                        self._count([r])
        met = [r for i, r in enumerate(chunk) if i not in alone]  # empty if every one was a prompt read alone
        results = iter([] if not met else [met[0].alone()] if len(met) == 1 else self._merged_pass(met))
        for r in met:
            if r.prompt is not None:
                r.member.took_prompt(r.prompt, r.cache)
        return [alone[i] if i in alone else next(results) for i in range(len(chunk))], met

    def _take_prompt_reading(self, r: PassRequest) -> None:
        """Set a prompt request's cache and ids to read (`Member.prompt_reading`); a prefix read for it now is
        a pass of its own, counted."""
        r.cache, r.input_ids, prefix_read = r.member.prompt_reading(r.prompt, r.shared)
        if prefix_read:
            with self.counting:
                self._count([r])

    def _merged_pass(self, chunk: list[PassRequest]) -> list[torch.Tensor]:
        member = chunk[0].member
        self.pass_slots.append([r.slot for r in chunk])
        resident = self.resident.pop(id(member.model), None)  # a stale one is dropped: it holds memory
        caches = [r.cache for r in chunk]
        self.reused += resident is not None and resident.holds(caches)
        committed = all(r.cache is r.member.cache for r in chunk)  # greedy steps, not forks (see Resident)
        inputs = [r.input_ids for r in chunk]
        lengths = [r.lengths for r in chunk]
        last_only = [r.last_only for r in chunk]
        results, stays = forward_together(member, caches, inputs, resident, committed, self.exact, lengths, last_only)
        if stays is not None:
            self.resident[id(member.model)] = stays
        return results


def plan_passes(
    requests: list[RequestShape],
    merges: Callable[[RequestShape], bool],
    memory_budget: int,
    merge_prompts: bool = False,
) -> list[PassPlan]:
    """The passes that run a round's waiting requests, in the order to run them; everything in slot order.

    The prompts come first, one pass each. The rest are grouped by weights and
    by whether they may share a pass (a request that may, on weights that `merges`: asked once per
    such request, in slot order); a group that merges is cut into chunks whose pass fits
    `memory_budget` (`pass_bytes`), any other runs one request per pass.

    `merge_prompts` (exact passes, where a request's numbers do not depend on its pass): every prompt joins its
    weights' merged passes, where it reads its tail after its shared prefix beside the other examples' steps.
    """
    ordered = sorted(requests, key=lambda r: r.slot)
    prompts = [r for r in ordered if r.prompt]
    joining = {r.slot for r in prompts if merge_prompts and merges(r)}
    plans = [PassPlan("prompt", (r.slot,)) for r in prompts if r.slot not in joining]
    groups: dict[tuple[int, bool], list[RequestShape]] = {}
    for r in ordered:
        if r.slot in joining:
            groups.setdefault((r.weights, True), []).append(r)
        elif not r.prompt:
            groups.setdefault((r.weights, r.mergeable and merges(r)), []).append(r)
    for (_, mergeable), group in groups.items():
        chunks = memory_chunks(group, memory_budget) if mergeable else [[r] for r in group]
        plans += [PassPlan(_kind(chunk), tuple(r.slot for r in chunk)) for chunk in chunks]
    return plans


def _kind(chunk: list[RequestShape]) -> str:
    if len(chunk) > 1:
        return "merged"
    return "prompt" if chunk[0].prompt else "alone"


def memory_chunks(group: list[RequestShape], memory_budget: int) -> list[list[RequestShape]]:
    """Split a group so that one merged pass (padded cache copies + logits) fits `memory_budget`;
    each chunk keeps the group's order. Raises `BatchMemoryError` for a request that cannot fit alone."""
    chunks, current = [], []
    for r in group:
        if current and pass_bytes(current + [r]) > memory_budget:
            chunks.append(current)
            current = []
        if pass_bytes([r]) > memory_budget:
            raise BatchMemoryError(
                f"model {r.model!r}: one example's forward pass needs about {pass_bytes([r]) >> 20} MiB, "
                f"more than the {memory_budget >> 20} MiB available"
            )
        current.append(r)
    return chunks + [current]


def pass_bytes(requests: list[RequestShape]) -> int:
    """About the memory a merged pass takes: the padded cache, the copies its requests take back, and the logits
    (made at each request's own positions: a prompt's long tail does not widen the others')."""
    longest = max(r.cached for r in requests)
    width = max(r.width for r in requests)
    return sum(
        r.rows * (2 * (longest + width) * r.kv_bytes_per_token + (1 if r.last_only else r.width) * r.vocab_size * 8)
        for r in requests
    )


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
    batch_size: int = DEFAULT_BATCH_SIZE,
    scheduler: Scheduler | None = None,
) -> Iterator[tuple[object, object]]:
    """Decode `items` with up to `batch_size` in flight; yields (item, decode(slot_members, item)) as each finishes.

    `decode` is called in a worker thread with a slot's member clones (None stays None: a model the
    method does not use). An exception in a worker ends the run and is raised here; so does a caller
    that stops iterating. Either way every worker thread has ended when this returns or raises.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    scheduler = scheduler or Scheduler()
    queue = iter(items)
    # A clone's place in row order: its batch slot, then its place among the slot's members (the members
    # of one example run side by side, `Scheduler.concurrently`, so their requests wait together).
    free = [
        [None if m is None else attach(m.clone(), scheduler, slot * len(members) + k) for k, m in enumerate(members)]
        for slot in range(batch_size)
    ]
    free.reverse()  # slots are taken from the end: the first example gets slot 0
    finished: list[tuple[object, object, list, BaseException | None]] = []
    threads: list[threading.Thread] = []

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
        threads.append(threading.Thread(target=work, args=(item, free.pop()), daemon=True))
        threads[-1].start()
        return True

    try:
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
    finally:
        scheduler.close()
        for thread in threads:
            thread.join()


def attach(member: Member, scheduler: Scheduler, slot: int) -> Member:
    member.scheduler, member.slot = scheduler, slot
    return member


_END = object()
