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
   example has finished. When all wait, `Scheduler.run_waiting` runs every waiting request: the
   prompts one after another, each from the longest prefix that any slot or a stored prompt holds
   (`PromptStore`: examples that start together read their task's few-shot prefix once), then one
   merged forward pass per weights (`forward_together`). Requests are taken in slot order, so which
   rows meet in a pass and where each row sits, and hence every float, never depend on which
   thread woke first (a GPU picks its kernels by shape).

5. The merged pass. Caches are left-padded to the longest and inputs right-padded; an attention
   mask hides the padding and position ids are each row's own, so every row sees exactly its own
   context (left padding shifts a row's keys and queries alike, so a sliding window keeps its
   extent). The merged cache is a buffer with room to grow (`ReservedLayer`) that a pass writes in
   place. Greedy steps of the same examples (`single`, UniTE, DeePEn: one committed row each,
   reading as many tokens as the others) keep views of their rows, and the next pass over exactly
   those caches reads the buffer as it is (`Resident`); forks (branches, candidates, spans) copy
   their rows out, since a fork waits for a commit and a view would keep every example's rows
   alive that long. A pass whose padded copies and logits would not fit the memory budget is
   split; one that cannot fit even alone is `BatchMemoryError`.

6. Endings. An exception in a worker, or a caller that stops iterating, ends the run: the scheduler
   is closed, every waiting request and every later one fails with `Cancelled`, and every worker
   thread is joined before `decode_many` returns or raises, so no thread is left waiting and no
   slot's clones and caches outlive the run.
"""

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import psutil
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from adafuse.errors import BatchMemoryError
from adafuse.invariance import Span, split_attention, split_pass
from adafuse.model import Member

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 8  # examples in flight; the runner's and the Python API's default (README: Batching)


class Cancelled(RuntimeError):
    """The run ended (another example failed, or the caller stopped) before this request ran."""


class ReservedLayer(DynamicLayer):
    """A merged pass's cache layer: a buffer with room to grow, into which new tokens are written in place.

    `DynamicLayer.update` concatenates, which copies the whole layer at every pass; this writes only
    the new positions. `keys` and `values` are views of the filled positions. Positions before a
    row's own context must be zeros (left padding, written by `_merge`): masked keys get no weight,
    and zero values keep 0 * value finite. The room after the filled positions is never read before
    a pass writes it, so it is left unset (zeroing it cost as much as the copies).
    """

    def __init__(self, like: torch.Tensor, rows: int, room: int):
        super().__init__()
        self.lazy_initialization(like, like)
        shape = (rows, like.shape[1], room, like.shape[3])
        self.key_buffer, self.value_buffer = like.new_empty(shape), like.new_empty(shape)
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[2]
        if end > self.key_buffer.shape[2]:
            more = (0, 0, 0, end + max(64, end // 4) - self.length)
            self.key_buffer = torch.nn.functional.pad(self.key_buffer[:, :, : self.length], more)
            self.value_buffer = torch.nn.functional.pad(self.value_buffer[:, :, : self.length], more)
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.fill(end)
        return self.keys, self.values

    def fill(self, length: int) -> None:
        self.length = length
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]


@dataclass
class Resident:
    """The padded cache of a merged pass that may serve the next pass as it is.

    Kept when every request was one model's committed context, one row, and read as many tokens as
    the others (a greedy step of each example in flight): each request's cache is then a view of its
    row, and the next pass over exactly these caches, unmoved, finds them laid out as a fresh merge
    would lay them out. Forks are never kept this way: their rows wait for a commit, and a view
    would keep the whole buffer, every example's rows, alive for as long as the longest wait.
    """

    caches: list[DynamicCache]
    merged: DynamicCache
    views: list[torch.Tensor]  # each cache's first-layer keys as handed back

    def holds(self, caches: list[DynamicCache]) -> bool:
        return len(caches) == len(self.caches) and all(
            c is mine and c.layers[0].keys is view for c, mine, view in zip(caches, self.caches, self.views)
        )


@torch.inference_mode()
def forward_together(
    member: Member,
    caches: list[DynamicCache],
    inputs: list[torch.Tensor],
    resident: Resident | None = None,
    may_stay: bool = False,
    exact: bool = True,
) -> tuple[list[torch.Tensor], Resident | None]:
    """One forward pass over the rows of several requests to the same weights: the logits of each, and
    the pass's cache where it may stay resident for the next pass (`may_stay`: every request is a
    model's committed context; see `Resident`).

    Request j has a cache of length L_j (rows b_j) and inputs (b_j, n_j). Caches are left-padded to
    the longest, inputs right-padded; the attention mask hides the padding and the position ids are
    each row's own (L_j, L_j + 1, ...), so every row sees exactly its own context. Left padding shifts
    a row's keys and queries alike, so a sliding window (Gemma 3) keeps its true extent. Afterwards
    each request's cache holds its own rows and new tokens, as if it had been read alone.

    `exact`: every request's numbers are bitwise those of its pass alone (adafuse/invariance.py:
    attention per request; the linear layers multiply all rows at once, in row tiles that make each
    row's bits independent of the others, alone and merged alike); a model whose attention cannot be
    split is refused (`can_merge_exactly`).
    Otherwise the merged mask stands for the padding, and results equal the alone pass's up to
    rounding.
    """
    lengths = [c.get_seq_length() for c in caches]
    longest, width = max(lengths), max(x.shape[1] for x in inputs)
    device = member.device
    ids = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=int(x[0, -1])) for x in inputs])
    mask = torch.zeros(ids.shape[0], longest + width, dtype=torch.long, device=device)
    positions = torch.empty(ids.shape[0], width, dtype=torch.long, device=device)
    row = 0
    for length, x in zip(lengths, inputs):
        mask[row : row + x.shape[0], longest - length : longest + x.shape[1]] = 1
        positions[row : row + x.shape[0]] = torch.arange(length, length + width, device=device)
        row += x.shape[0]

    merged = resident.merged if resident is not None and resident.holds(caches) else _merge(caches, longest, width)
    kwargs = {"input_ids": ids, "position_ids": positions, "use_cache": True, member.cache_arg: merged}
    if exact:
        if not can_merge_exactly(member.model):  # idempotent: it prepares a model on its first merged pass
            raise ValueError(f"model {member.name!r}: its attention cannot be split per request; run its passes alone")
        spans, row = [], 0
        for length, x in zip(lengths, inputs):
            spans.append(Span(slice(row, row + x.shape[0]), length, x.shape[1]))
            row += x.shape[0]
        with split_pass(spans, longest):
            out = member.model(**kwargs)  # each request's own masks replace the merged one
    else:
        out = member.model(attention_mask=mask, **kwargs)
    stays = may_stay and all(x.shape == (1, width) for x in inputs)
    logits, results, row = out.logits.float(), [], 0
    for cache, length, x in zip(caches, lengths, inputs):
        rows, span = slice(row, row + x.shape[0]), slice(longest - length, longest + x.shape[1])
        for own, new in zip(cache.layers, merged.layers):
            own.keys, own.values = new.keys[rows, :, span], new.values[rows, :, span]
            if not stays:
                # Copies: a view would keep the whole padded merged cache alive for as long as any one
                # request keeps its cache (a scored candidate waits for the commit), and on GSM8K with
                # 8 examples in flight those merged caches reached 11 GB.
                own.keys, own.values = own.keys.clone(), own.values.clone()
        results.append(logits[rows, : x.shape[1]])
        row += x.shape[0]
    return results, Resident(list(caches), merged, [c.layers[0].keys for c in caches]) if stays else None


def can_merge_exactly(model) -> bool:
    """Prepare a model for exact merged passes (adafuse/invariance.py); False if it cannot be. Its linear
    layers need nothing: every member's multiply in row tiles in every pass (`tile_linear_layers`)."""
    return split_attention(model)


def _merge(caches: list[DynamicCache], longest: int, width: int) -> DynamicCache:
    """The caches left-padded to `longest` and stacked, with room for this pass and some steps after it."""
    merged = DynamicCache()
    for layer in range(len(caches[0].layers)):
        own = [c.layers[layer] for c in caches]
        rows = sum(o.keys.shape[0] for o in own)
        stacked = ReservedLayer(own[0].keys, rows, longest + width + 64)
        row = 0
        for o in own:
            n, length = o.keys.shape[0], o.keys.shape[2]
            for buffer, own_tensor in ((stacked.key_buffer, o.keys), (stacked.value_buffer, o.values)):
                buffer[row : row + n, :, : longest - length] = 0
                buffer[row : row + n, :, longest - length : longest] = own_tensor
            row += n
        stacked.fill(longest)
        merged.layers.append(stacked)
    return merged


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


@dataclass
class PassRequest:
    """One forward pass a worker asks for: input ids read after a cache, or a prompt to read."""

    member: Member
    cache: object
    input_ids: torch.Tensor | None
    last_only: bool
    prompt: list[int] | None = None  # a prompt to read (`Member.read_prompt`) instead of input_ids
    done: threading.Event = field(default_factory=threading.Event)
    result: torch.Tensor | None = None
    error: BaseException | None = None

    @property
    def slot(self) -> int:
        return self.member.slot

    @property
    def mergeable(self) -> bool:
        # Several ids read for their last logits alone stay alone: merged with others they would need
        # the logits of every position (gigabytes with a 262k vocabulary). An empty cache has no layers to pad.
        return not (self.last_only and self.input_ids.shape[1] > 1) and self.cache.get_seq_length() > 0


class Scheduler:
    """Gathers the forward requests of every example in flight and runs them in merged passes."""

    def __init__(self, memory_budget: int | None = None, exact: bool = True):
        self.exact = exact  # merged passes bitwise equal to each request alone (adafuse/invariance.py)
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
        "passes": ..., "merged_passes": ..., "rows": ...}."""
        report = {}
        for name, counts in self.counts.items():
            meeting = self.meetings.get(name)
            how = {"attention": None, "linear": None} if meeting is None else asdict(meeting)
            report[name] = how | asdict(counts)
        return report

    def forward(self, member: Member, cache, input_ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """Called by a worker: block until the scheduler has run this pass."""
        return self._wait(PassRequest(member, cache, input_ids, last_only))

    def read_prompt(self, member: Member, ids: list[int]) -> torch.Tensor:
        """Called by a worker: block until the scheduler has read this prompt into the member's cache."""
        return self._wait(PassRequest(member, None, None, True, prompt=ids))

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

    def close(self) -> None:
        """End the run: fail every waiting request (and every later one), drop the resident caches."""
        with self.lock:
            self.closed = True
            cancelled, self.waiting = self.waiting, []
            self.resident.clear()
            self.lock.notify_all()
        for r in cancelled:
            r.error = Cancelled("the batched run has ended")
            r.done.set()

    def run_waiting(self) -> None:
        """Run every waiting request: the prompts one by one, each reusing what the ones before it read
        (examples that start together share their few-shot prefix); the rest in one merged pass per
        weights, split where memory requires. Everything in slot order."""
        requests, self.waiting = sorted(self.waiting, key=lambda r: r.slot), []
        try:
            for r in requests:
                if r.prompt is not None:
                    self._run([r])
            groups: dict[tuple[int, bool], list[PassRequest]] = {}
            for r in requests:
                if r.prompt is None:
                    groups.setdefault((id(r.member.model), r.mergeable and self._merges(r.member)), []).append(r)
            for (_, mergeable), group in groups.items():
                chunks = self._chunks(group) if mergeable else [[r] for r in group]
                for chunk in chunks:
                    self._run(chunk)
        finally:  # a pass that could not even be planned (BatchMemoryError) leaves no worker waiting
            for r in requests:
                if not r.done.is_set():
                    r.error = Cancelled("the batched run has ended")
                    r.done.set()

    def _run(self, chunk: list[PassRequest]) -> None:
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
        rows = sum(1 if r.prompt is not None else r.input_ids.shape[0] for r in chunk)
        self.passes += 1
        self.merged += len(chunk) > 1
        self.rows += rows
        counts = self.counts.setdefault(chunk[0].member.name, PassCounts())
        counts.passes += 1
        counts.merged_passes += len(chunk) > 1
        counts.rows += rows
        for r in chunk:
            r.done.set()

    def _merged(self, chunk: list[PassRequest]) -> list[torch.Tensor]:
        member = chunk[0].member
        self.pass_slots.append([r.slot for r in chunk])
        resident = self.resident.pop(id(member.model), None)  # a stale one is dropped: it holds memory
        caches = [r.cache for r in chunk]
        self.reused += resident is not None and resident.holds(caches)
        committed = all(r.cache is r.member.cache for r in chunk)  # greedy steps, not forks (see Resident)
        inputs = [r.input_ids for r in chunk]
        results, stays = forward_together(member, caches, inputs, resident, committed, exact=self.exact)
        if stays is not None:
            self.resident[id(member.model)] = stays
        return results

    def _chunks(self, group: list[PassRequest]) -> list[list[PassRequest]]:
        """Split a group so that one merged pass (padded cache copies + logits) fits the memory budget;
        each chunk keeps slot order."""
        chunks, current = [], []
        for r in group:
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


def pass_bytes(requests: list[PassRequest]) -> int:
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
    free = [[None if m is None else attach(m.clone(), scheduler, slot) for m in members] for slot in range(batch_size)]
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
