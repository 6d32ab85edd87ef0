"""The planner: which forward passes run a step's waiting requests, as plain data in and plain data out (vLLM's
scheduler hands its executor a plan the same way; adafuse/engine/executor.py runs it).

A request is described by its `RequestShape` (no model, no tensor: `shape_of` reads it off the request): its
place in the step's row order, the weights it runs on, whether it is a prompt and whether that prompt's shared
prefix must be read first, its rows, its cache length and width. `plan_step` turns the shapes into `PassPlan`s:

1. "prefix": each shared prompt prefix that no earlier step stored, read once (in a pass of its own, from
   nothing, so a prompt's numbers never depend on which prompts came before it), for every prompt of the step
   that starts with it;
2. "prompt": each prompt without a shared prefix, read whole from nothing, alone;
3. "merged" / "alone": everything else, per weights, in place order: the requests that may share a pass (their
   weights split attention per request and they read after a cache) in passes cut where one would not fit the
   memory budget (`pass_bytes`), one pass of their own each otherwise. A prompt with a prefix reads its tail
   after it here, beside the other examples' steps.

One request that cannot fit even alone is `BatchMemoryError`, raised while planning, before any pass runs.
"""

from collections.abc import Callable
from dataclasses import dataclass

from adafuse.errors import BatchMemoryError
from adafuse.member.passes import Forward, ReadPrompt

PREFIX, PROMPT, MERGED, ALONE = "prefix", "prompt", "merged", "alone"


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


def shape_of(place: int, request: Forward | ReadPrompt) -> RequestShape:
    """The planner's view of a request: read off its runner and cache, and the runner's store of prefixes."""
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
        stored = not prefix or runner.prompts.get(list(prefix)) is not None
        return RequestShape(
            **common,
            prompt=True,
            prefix=None if stored else prefix,
            mergeable=bool(prefix) and runner.prepared.splits_attention,
            rows=1,
            cached=len(prefix),
            width=len(request.ids) - len(prefix),
            last_only=True,
        )
    cached = request.cache.get_seq_length()
    return RequestShape(
        **common,
        prompt=False,
        prefix=None,
        mergeable=cached > 0 and runner.prepared.splits_attention,
        rows=request.input_ids.shape[0],
        cached=cached,
        width=request.input_ids.shape[1],
        last_only=request.last_only,
    )


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
        chunks = memory_chunks(group, memory_budget(weights)) if mergeable else [[r] for r in group]
        plans += [PassPlan(MERGED if len(chunk) > 1 else ALONE, tuple(r.place for r in chunk)) for chunk in chunks]
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
