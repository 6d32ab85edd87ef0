"""The executor: runs the forward passes of one engine step (adafuse/engine/loop.py) and hands back each request's
result. It decides nothing: `plan_passes` (adafuse/engine/planner.py) says which requests share a pass.

A pass is one of three kinds. "prompt": a prompt read by itself (its shared prefix from the prompt store or
read first, then the rest after it: `Member.prompt_reading`). "alone": one request's pass
(`Member.forward_alone`). "merged": the rows of several requests to the same weights in one forward pass
(adafuse/backend/split_pass.py `forward_together`); exact (the default), every request's numbers are those of its
pass alone (adafuse/backend/invariance.py), and a prompt in it reads the rest after its shared prefix there.

Each model's passes run in plan order. On the CPU (adafuse/backend/__init__.py `side_by_side`) different models' passes
run side by side, one model on the engine's thread and each other on a kept thread, each on its share of the
cores (adafuse/backend/cpu/cores.py): one model's Python overlaps the other's multiplies. No pass reads what another
model's pass writes, and a pass's bits never depend on which thread ran it. Elsewhere they run one after
another on the engine's thread.
"""

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from adafuse.backend.cpu.cores import CoreShare
from adafuse.backend.split_pass import Resident, forward_together
from adafuse.engine.planner import PassPlan, RequestShape, available_memory, plan_passes
from adafuse.member.passes import Forward, ReadPrompt


@dataclass(frozen=True)
class Meeting:
    """How one model's requests from different examples meet. Each part of the layer is "merged" (one
    computation over every request's rows, not batch-invariant), "row_tiles" (linear layers: one multiply
    over every request's rows padded to fixed row tiles, bit-identical to each request alone:
    adafuse/backend/invariance.py), "per_request" (attention: inside the merged pass, each request's rows on
    their own) or "alone" (no merged passes: each request runs its own)."""

    attention: str
    linear: str


@dataclass
class PassCounts:
    """One model's forward passes (a prompt read is one pass of one row)."""

    passes: int = 0
    merged_passes: int = 0  # passes that carried the requests of more than one example
    rows: int = 0  # rows over all passes
    merged_prompts: int = 0  # prompts read in a merged pass, not in a pass of their own (`plan_passes`)
    # wall time its passes took, log-softmax included (on its own thread, beside the other model's passes)
    seconds: float = 0.0


class Waiting:
    """One request of a step, with its place in row order, while it waits for its pass."""

    def __init__(self, place: int, request: Forward | ReadPrompt):
        self.place = place
        self.request = request
        self.member = request.member
        self.result = None
        if isinstance(request, ReadPrompt):  # what it reads, once its prompt reading is taken (`take_prompt`)
            self.cache, self.input_ids, self.last_only = None, None, True
        else:
            self.cache, self.input_ids, self.last_only = request.cache, request.input_ids, request.last_only

    @property
    def prompt(self) -> bool:
        return isinstance(self.request, ReadPrompt)

    @property
    def lengths(self) -> list[int] | None:
        return None if self.prompt else self.request.lengths

    def shape(self) -> RequestShape:
        member, prompt = self.member, self.prompt
        return RequestShape(
            slot=self.place,
            model=member.name,
            weights=id(member.model),
            prompt=prompt,
            # a pass after an empty cache has no layers to read from or pad (a prompt read whole runs alone)
            mergeable=not prompt and self.cache.get_seq_length() > 0,
            rows=1 if prompt else self.input_ids.shape[0],
            cached=0 if prompt else self.cache.get_seq_length(),
            width=len(self.request.ids) if prompt else self.input_ids.shape[1],
            last_only=self.last_only,
            kv_bytes_per_token=member.kv_bytes_per_token,
            vocab_size=member.vocab_size,
        )

    def take_prompt(self) -> bool:
        """Set a prompt's cache and ids to read (`Member.prompt_reading`); True if its shared prefix was read now."""
        self.cache, self.input_ids, fresh = self.member.prompt_reading(self.request.ids, self.request.shared)
        return fresh

    def alone(self) -> torch.Tensor:
        return self.member.forward_alone(self.cache, self.input_ids, self.last_only, self.lengths)

    def finish(self, logits: torch.Tensor) -> None:
        """Its result from its logits: (cache, logits) for a prompt, else the logits or their log-softmax."""
        if self.prompt:
            self.result = (self.cache, logits)
        else:
            self.result = self.member.log_softmax(logits, owned=True) if self.request.logprobs else logits


class Executor:
    """Runs each step's requests in the passes `plan_passes` plans, and counts them per model."""

    def __init__(self, memory_budget: int | None = None, exact: bool = True, side_by_side: bool = True):
        self.exact = exact  # merged passes bitwise equal to each request alone (adafuse/backend/invariance.py)
        # on the CPU, different models' passes of a step run on threads of their own; False: one model's after
        # the other's, each on every core (what a model's passes cost with nothing beside them; same outputs)
        self.side_by_side = side_by_side
        self.memory_budget = memory_budget or available_memory()
        self.resident: dict[int, Resident] = {}  # per weights: the last merged pass's cache, if it may serve the next
        self.reused = 0  # merged passes that read the last one's cache in place
        self.pass_slots: list[list[int]] = []  # the places of each merged pass's requests, in row order
        self.meetings: dict[str, Meeting] = {}  # per model name: how its requests meet
        self.counts: dict[str, PassCounts] = {}  # per model name: its passes

    @property
    def passes(self) -> int:
        """Forward passes run, over every model."""
        return sum(c.passes for c in self.counts.values())

    @property
    def rows(self) -> int:
        """Rows over those passes."""
        return sum(c.rows for c in self.counts.values())

    @property
    def merged(self) -> int:
        """Passes that carried the requests of more than one example."""
        return sum(c.merged_passes for c in self.counts.values())

    def _merges(self, member) -> bool:
        """May this member's requests share a pass? With `exact`, only if its attention can be split."""
        if member.name not in self.meetings:
            if not self.exact:
                self.meetings[member.name] = Meeting("merged", "merged")
            elif not member.installed.splits_attention:
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

    def close(self) -> None:
        """Drop the resident caches: they hold memory, and no later pass may read them."""
        self.resident.clear()

    def run(self, requests: Sequence[tuple[int, Forward | ReadPrompt]]) -> list:
        """Run the (place, request) pairs of one step; their results in the same order. Places order the rows
        of a merged pass, so which rows meet and where each sits, and every float, never depend on the order
        the requests were asked for in."""
        waiting = sorted((Waiting(place, request) for place, request in requests), key=lambda w: w.place)
        by_place = {w.place: w for w in waiting}
        if len(by_place) != len(waiting):
            raise AssertionError(f"two requests share a place: {[w.place for w in waiting]}")
        plans = plan_passes(
            [w.shape() for w in waiting],
            lambda shape: self._merges(by_place[shape.slot].member),
            self.memory_budget,
            merge_prompts=self.exact,
        )
        by_weights: dict[int, list[PassPlan]] = {}
        for plan in plans:
            member = by_place[plan.slots[0]].member
            by_weights.setdefault(id(member.model), []).append(plan)
            self.counts.setdefault(member.name, PassCounts())  # in plan order: the report's model order
        groups = [[[by_place[place] for place in plan.slots] for plan in group] for group in by_weights.values()]
        backends = {w.member.backend for w in waiting}
        if self.side_by_side and len(groups) > 1 and all(b.side_by_side for b in backends):
            self._side_by_side(groups, next(iter(backends)).cores)
        else:
            for group in groups:
                for chunk in group:
                    self._run_pass(chunk)
        order = {place: i for i, (place, _) in enumerate(requests)}
        results = [None] * len(requests)
        for w in waiting:
            results[order[w.place]] = w.result
        return results

    def _side_by_side(self, groups: list[list[list[Waiting]]], cores) -> None:
        """Each model's passes in plan order, the first model's on this thread and every other's on a kept thread
        of its own, all at once, each on its share of the cores. The first error, in model order, is raised once
        every model's passes have ended."""
        share = CoreShare(len(groups))
        threads, inference = torch.get_num_threads(), torch.is_inference_mode_enabled()

        def run_group(group: list[list[Waiting]]) -> None:
            # A kept thread holds the thread count it started with, and a kernel's bits may depend on it
            # (attention); inference mode is per thread: each runs in the engine's.
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            with torch.inference_mode(inference), share.joined():
                for chunk in group:
                    self._run_pass(chunk)

        others = [cores.kept_threads("pass", 7).submit(run_group, group) for group in groups[1:]]
        errors: list[BaseException] = []
        try:
            run_group(groups[0])
        except BaseException as err:
            errors.append(err)
        for done in others:
            try:
                done.result()
            except BaseException as err:
                errors.append(err)
        if errors:
            raise errors[0]

    def _run_pass(self, chunk: list[Waiting]) -> None:
        """Run one planned pass over its requests (in row order), give each its result, and count the pass."""
        member = chunk[0].member
        start = time.perf_counter()
        if len(chunk) == 1 and chunk[0].prompt:
            (w,) = chunk
            if w.take_prompt():
                self._count([w])  # its shared prefix was read now, in a pass of its own
            w.finish(w.alone())
            met = chunk
        elif len(chunk) == 1:
            chunk[0].finish(chunk[0].alone())
            met = chunk
        else:
            met = self._merged(chunk)
        if met:
            self._count(met)
        self.counts[member.name].seconds += time.perf_counter() - start

    def _count(self, met: list[Waiting]) -> None:
        """Count one pass over the requests `met` (a prompt read is one row). Different models' passes count
        into different entries, so passes side by side never write the same one."""
        rows = sum(1 if w.prompt else w.input_ids.shape[0] for w in met)
        merged = len(met) > 1
        counts = self.counts[met[0].member.name]
        counts.passes += 1
        counts.merged_passes += merged
        counts.rows += rows
        counts.merged_prompts += sum(w.prompt for w in met) if merged else 0

    def _merged(self, chunk: list[Waiting]) -> list[Waiting]:
        """Run a merged plan: the requests that met in its pass (a prompt in it reads its tail after its shared
        prefix, its positions joining the packed pass; one without a prefix is read whole, alone, first, in a
        pass counted of its own)."""
        for w in chunk:
            if w.prompt:
                if w.take_prompt():
                    self._count([w])
                if w.cache.get_seq_length() == 0:
                    w.finish(w.alone())
                    self._count([w])
        met = [w for w in chunk if w.result is None]
        if len(met) == 1:
            met[0].finish(met[0].alone())
        elif met:
            for w, logits in zip(met, self._merged_pass(met)):
                w.finish(logits)
        return met

    def _merged_pass(self, chunk: list[Waiting]) -> list[torch.Tensor]:
        member = chunk[0].member
        self.pass_slots.append([w.place for w in chunk])
        resident = self.resident.pop(id(member.model), None)  # a stale one is dropped: it holds memory
        caches = [w.cache for w in chunk]
        self.reused += resident is not None and resident.holds(caches)
        committed = all(not w.prompt and w.cache is w.member.cache for w in chunk)  # greedy steps, not forks
        results, stays = forward_together(
            member,
            caches,
            [w.input_ids for w in chunk],
            resident,
            committed,
            self.exact,
            [w.lengths for w in chunk],
            [w.last_only for w in chunk],
        )
        if stays is not None:
            self.resident[id(member.model)] = stays
        return results
