"""The scheduler: which examples start, and which forward passes run a step's waiting requests, as plain data in and
plain data out (vLLM's scheduler hands its executor a plan the same way; adafuse/engine/executor.py runs it, and the
loop, adafuse/engine/loop.py, hands each example its results).

Admission (`Scheduler.admits`): an example starts only where every device has room for its KV beside the examples in
flight, so that a full GPU holds an example back instead of running out of memory in the middle of a pass.

Planning. A request is described by its `RequestShape` (no model, no tensor: `shape_of` reads it off the request
through the member's API): its place in the step's row order, the weights it runs on, whether it is a prompt and
whether that prompt's shared prefix must be read first, its rows, its cache length and width. `plan_step` turns the
shapes into `PassPlan`s, each of one kind (adafuse/backend/interface.py):

1. PREFIX: each shared prompt prefix that no earlier step stored, read once (in a pass of its own, from nothing, so
   a prompt's numbers never depend on which prompts came before it), for every prompt of the step that starts with
   it;
2. PROMPT: each prompt without a shared prefix, read whole from nothing, alone;
3. MERGED: per weights, in place order, the requests that may share a pass (their weights split attention per
   request and they read after a cache), in passes cut where one would not fit the memory budget (`pass_bytes`): one
   pass however many requests it carries, one alone included, so that a request's bits never depend on whether
   another example happened to ask in the same step. A prompt with a prefix reads its tail after it here, beside
   the other examples' steps;
4. ALONE: each request that may not share a pass (its weights' attention cannot be split), one pass each.

One request that cannot fit even alone is `BatchMemoryError`, raised while planning, before any pass runs.

After a step (`update`) the scheduler reads the KV bytes each model's examples hold: what the next admission counts
on, and what a run records (`report`).
"""

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from adafuse.backend import ALONE, MERGED, PREFIX, PROMPT
from adafuse.errors import BatchMemoryError
from adafuse.member.passes import Forward, ReadPrompt


@dataclass(frozen=True)
class RequestShape:
    """What the planner reads of a waiting request (plain data: `plan_step` needs no model)."""

    place: int  # its place in the step's row order: its example's slot, then its place among the example's requests
    model: str  # the model's name
    weights: int  # which weights it runs on: only requests to the same weights share a pass
    prompt: bool  # a prompt to read (`ReadPrompt`)
    prefix: tuple[int, ...] | None  # a prompt's shared prefix that is not stored yet: read first, once
    mergeable: bool  # it may share a pass: its weights split attention per request and it reads after a cache
    rows: int
    cached: int  # positions before the ids it reads (a prompt: its shared prefix)
    width: int  # ids it reads
    last_only: bool  # it needs the logits of its last position alone
    kv_bytes_per_token: int  # over all layers
    layers: int
    vocab_size: int


@dataclass(frozen=True)
class PassPlan:
    """One forward pass to run: its kind (PREFIX, PROMPT, MERGED or ALONE) and its requests' places in row
    order (a PREFIX pass: the first prompt that asked for the prefix)."""

    kind: str
    places: tuple[int, ...]


@dataclass
class KVFigures:
    """One model's KV as a run records it."""

    kv_peak_bytes: int = 0  # the most bytes of KV its examples' contexts and forks held at once
    kv_peak_bytes_per_example: int = 0  # the most they held at the end of a step, over the examples in flight
    kv_prefix_bytes: int = 0  # the most bytes its stored prompt prefixes held (shared by its examples)
    kv_bytes_per_token: int = 0  # one position's keys and values over all layers
    longest_context: int = 0  # the most positions a context or fork reached: one context's KV is at most this many


def shape_of(place: int, request: Forward | ReadPrompt) -> RequestShape:
    """The planner's view of a request: read off its runner (adafuse/member/runner.py's API) and its read."""
    runner = request.runner
    common = {
        "place": place,
        "model": runner.name,
        "weights": id(runner),
        "kv_bytes_per_token": runner.kv_bytes_per_token,
        "layers": runner.layers,
        "vocab_size": runner.vocab_size,
    }
    if isinstance(request, ReadPrompt):
        prefix = tuple(request.ids[: request.prefix_length])
        return RequestShape(
            **common,
            prompt=True,
            prefix=None if runner.prefix_stored(request) else prefix,
            mergeable=bool(prefix) and runner.splits_attention,
            rows=1,
            cached=len(prefix),
            width=len(request.ids) - len(prefix),
            last_only=True,
        )
    read = request.read
    cached = read.cache.get_seq_length()
    return RequestShape(
        **common,
        prompt=False,
        prefix=None,
        mergeable=cached > 0 and runner.splits_attention,
        rows=read.rows,
        cached=cached,
        width=read.input_ids.shape[1],
        last_only=read.last_only,
    )


class Scheduler:
    """Admits examples and plans each step's passes (module docstring). `memory_budget`: the bytes one pass may take
    (None: what the model's backend says at each step)."""

    def __init__(self, memory_budget: int | None = None):
        self.memory_budget = memory_budget
        self.kv: dict[str, KVFigures] = {}  # per model name, in the order models first ran

    def admits(self, runners, in_flight: int) -> bool:
        """Is there room on every device for one more example beside the `in_flight` ones? On each device, the
        KV its examples may hold, the device's free memory and what they hold now, must cover one more example and
        one example's worth to spare (for forks and a pass's transients) beside those in flight. An example's KV is
        the most one held at a step's end so far (per model), or what those in flight hold each now. With nothing
        in flight, or nothing known yet of what an example holds, the example is admitted."""
        if not in_flight:
            return True
        by_device: dict = {}
        for runner in runners:
            by_device.setdefault(runner.device, []).append(runner)
        for device, here in by_device.items():
            per_example = held = 0
            for runner in here:
                seen = self.kv.get(runner.name)
                per_example += max(runner.kv_held() // in_flight, seen.kv_peak_bytes_per_example if seen else 0)
                held += runner.kv_held()
            if (in_flight + 2) * per_example > here[0].backend.free_memory(device) + held:
                return False
        return True

    def schedule(self, requests: Sequence[Forward | ReadPrompt]) -> list[PassPlan]:
        """The passes for a step's requests (in place order), each model's memory budget asked of its backend once
        per step unless `memory_budget` is set."""
        shapes = [shape_of(place, r) for place, r in enumerate(requests)]
        runners = {id(r.runner): r.runner for r in requests}
        for runner in runners.values():
            if runner.name not in self.kv:
                runner.reset_kv_peak()  # this run's peak, not an earlier run's over the same model
                self.kv[runner.name] = KVFigures(kv_bytes_per_token=runner.kv_bytes_per_token)
        for shape in shapes:
            figures = self.kv[shape.model]
            figures.longest_context = max(figures.longest_context, shape.cached + shape.width)
        budgets: dict[int, int] = {}

        def budget(weights: int) -> int:
            if weights not in budgets:
                runner = runners[weights]
                budgets[weights] = self.memory_budget or runner.backend.memory_budget(runner.device)
            return budgets[weights]

        return plan_step(shapes, budget)

    def update(self, requests: Sequence[Forward | ReadPrompt], examples: int) -> None:
        """After a step: the KV each model's `examples` in flight hold now, and the most they ever held."""
        for runner in {id(r.runner): r.runner for r in requests}.values():
            figures = self.kv[runner.name]
            figures.kv_peak_bytes = max(figures.kv_peak_bytes, runner.kv_peak())
            figures.kv_peak_bytes_per_example = max(
                figures.kv_peak_bytes_per_example, runner.kv_held() // max(examples, 1)
            )
            figures.kv_prefix_bytes = max(figures.kv_prefix_bytes, runner.kv_prefixes())

    def report(self) -> dict[str, dict]:
        """Per model name, its KV figures as plain data (`KVFigures`)."""
        return {name: asdict(figures) for name, figures in self.kv.items()}


def plan_step(shapes: list[RequestShape], memory_budget: Callable[[int], int]) -> list[PassPlan]:
    """The passes that run a step's requests, in the order to run them (module docstring); `memory_budget(weights)`
    is the bytes one pass on those weights may take."""
    ordered = sorted(shapes, key=lambda r: r.place)
    plans, prefixes = [], set()
    for r in ordered:
        if r.prefix is not None and (r.weights, r.prefix) not in prefixes:
            prefixes.add((r.weights, r.prefix))
            plans.append(PassPlan(PREFIX, (r.place,)))
    plans += [PassPlan(PROMPT, (r.place,)) for r in ordered if r.prompt and not r.cached]
    groups: dict[tuple[int, bool], list[RequestShape]] = {}
    for r in ordered:
        if not (r.prompt and not r.cached):
            groups.setdefault((r.weights, r.mergeable), []).append(r)
    for (weights, mergeable), group in groups.items():
        if mergeable:
            chunks = memory_chunks(group, memory_budget(weights))
            plans += [PassPlan(MERGED, tuple(r.place for r in chunk)) for chunk in chunks]
        else:
            plans += [PassPlan(ALONE, (r.place,)) for r in group]
    return plans


def memory_chunks(group: list[RequestShape], memory_budget: int) -> list[list[RequestShape]]:
    """Split a group so that each merged pass fits `memory_budget` (`pass_bytes`); each chunk keeps the group's
    order. Raises `BatchMemoryError` for a request that cannot fit alone."""
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
    """About the memory a pass takes beyond what its requests' contexts hold: the new positions' keys and values
    (kept), one layer's whole keys and values of each request at a time (its attention's input, dropped after
    it: adafuse/member/cache.py), and float32 logits with their log-softmax where they are read."""
    total = 0
    for r in requests:
        new_kv = r.rows * r.width * r.kv_bytes_per_token
        attention = r.rows * (r.cached + r.width) * r.kv_bytes_per_token // max(r.layers, 1)
        logits = r.rows * (1 if r.last_only else r.width) * r.vocab_size * 8
        total += new_kv + attention + logits
    return total
