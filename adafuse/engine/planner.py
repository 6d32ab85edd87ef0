"""The planner: which forward passes run a step's waiting requests, as plain data in and plain data out
(vLLM's scheduler hands its executor a plan the same way; adafuse/engine/executor.py runs it).

A request is described by its `RequestShape` (no model, no tensor): the example's slot, the weights it runs
on, whether it is a prompt to read, its rows, its cache length and width. `plan_passes` groups the requests
into passes in slot order: the prompts first, each a pass of its own, then one merged pass per weights, cut
where a pass would not fit the memory budget (`pass_bytes`). Exact, a prompt joins its weights' merged pass
instead, after its shared prefix. One request that cannot fit even alone is `BatchMemoryError`, raised while
planning, before any pass of the step runs.
"""

from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from adafuse.errors import BatchMemoryError


@dataclass(frozen=True)
class RequestShape:
    """What the planner reads of a waiting request (plain data: `plan_passes` needs no model)."""

    slot: int  # its place in a pass's row order: its example's slot, then its place among the example's requests
    model: str  # the member's name
    weights: int  # which weights it runs on: only requests to the same weights share a pass
    prompt: bool  # a prompt to read (`ReadPrompt`): a pass of its own, or in a merged pass (`plan_passes`)
    mergeable: bool  # the request itself may share a pass (a pass after an empty cache runs alone)
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
