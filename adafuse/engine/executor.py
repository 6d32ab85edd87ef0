"""The executor: turns a step's plan (adafuse/engine/planner.py) into passes as the backend takes them
(adafuse/backend/: `Pass`es of `Read`s), has each model's backend run them, and hands each request its result.
It decides nothing about which requests meet: that is the plan.

It switches on each plan's kind. A "prefix" pass reads a shared prompt prefix into the model's store of
prefixes (adafuse/member/cache.py `PromptStore`), frozen: every prompt that starts with it reads it in place
and writes after it into a buffer of its own. Prefix passes run first, then the rest: a "prompt" pass reads a
whole prompt from nothing; an "alone" pass one request; a "merged" pass several requests to the same weights,
each computed as alone. A prompt's result is its context cache and its last position's logits.

It counts each model's passes, rows and seconds, and the bytes of KV its contexts hold (`report`).
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from transformers import DynamicCache

from adafuse.backend import ALONE, MERGED, PREFIX, Execution, Pass, Read
from adafuse.engine import planner
from adafuse.engine.planner import PassPlan, plan_step, shape_of
from adafuse.member.cache import context_cache, view_cache
from adafuse.member.passes import Forward, ReadPrompt

BACKEND_KIND = {planner.PREFIX: PREFIX, planner.PROMPT: ALONE, planner.ALONE: ALONE, planner.MERGED: MERGED}


@dataclass
class PassCounts:
    """One model's forward passes (a prompt read is one pass of one row) and the KV its contexts held."""

    passes: int = 0
    merged_passes: int = 0  # passes that carried the requests of more than one example
    rows: int = 0  # rows over all passes
    merged_prompts: int = 0  # prompts whose tail was read in a merged pass
    prefix_passes: int = 0  # shared prompt prefixes read (once each, for every prompt that starts with them)
    # its passes' time, log-softmax included (on a CPU, on its own thread beside the other model's passes; on a GPU,
    # what the GPU spent, from each pass's first kernel to its last), and what the host took to run or launch them
    seconds: float = 0.0
    host_seconds: float = 0.0
    kv_peak_bytes: int = 0  # the most bytes of KV its examples' contexts and forks held at once
    kv_peak_bytes_per_example: int = 0  # the most they held at the end of a step, over the examples in flight
    kv_prefix_bytes: int = 0  # the most bytes its stored prompt prefixes held (shared by its examples)
    kv_bytes_per_token: int = 0  # one position's keys and values over all layers
    longest_context: int = 0  # the most positions a context or fork reached: one context's KV is at most this many


class Executor:
    """Runs each step's plan and counts the passes per model. `exact` (the default): every request's numbers
    are those of its pass alone (adafuse/backend/tiles.py); `side_by_side`: on the CPU, different models'
    passes of a step run at once (the same results either way); `memory_budget`: the bytes one pass may take
    (None: what the model's backend says at each step)."""

    def __init__(self, memory_budget: int | None = None, exact: bool = True, side_by_side: bool = True):
        self.how = Execution.here(exact, side_by_side)
        self.memory_budget = memory_budget
        self.counts: dict[str, PassCounts] = {}  # per model name, in the order models first ran
        self.how_met: dict[str, dict[str, str]] = {}  # per model name: how its backend runs its passes (`_way`)
        self._watched: set[str] = set()  # models whose KV peak this executor counts

    @property
    def exact(self) -> bool:
        return self.how.exact

    @property
    def passes(self) -> int:
        """Forward passes run, over every model."""
        return sum(c.passes for c in self.counts.values())

    @property
    def merged(self) -> int:
        """Passes that carried the requests of more than one example."""
        return sum(c.merged_passes for c in self.counts.values())

    def plan(self, requests: Sequence[Forward | ReadPrompt]) -> list[PassPlan]:
        """The planner's passes for a step's requests (in place order), with each model's memory budget for the
        step: `memory_budget`, else what its backend says now (asked once per model and step)."""
        budgets: dict[int, int] = {}
        runners = {id(r.runner): r.runner for r in requests}
        for runner in runners.values():
            if runner.name not in self.counts and runner.name not in self._watched:
                runner.ledger.reset_peak()  # this executor's peak, not an earlier run's over the same model
                self._watched.add(runner.name)

        def budget(weights: int) -> int:
            if weights not in budgets:
                runner = runners[weights]
                budgets[weights] = self.memory_budget or runner.backend.memory_budget(runner.device)
            return budgets[weights]

        return plan_step([shape_of(place, r) for place, r in enumerate(requests)], budget)

    def admits(self, runners, in_flight: int) -> bool:
        """Is there room on every device for one more example beside the `in_flight` ones? On each device, the
        KV its examples may hold, the device's free memory and what they hold now, must cover one more example and
        one example's worth to spare (for forks and a pass's transients) beside those in flight: a full GPU holds
        an example back instead of running out of memory in the middle of a pass. An example's KV is the most one
        held at a step's end so far (per model), or what those in flight hold each now. With nothing in flight,
        or nothing known yet of what an example holds, the example is admitted."""
        if not in_flight:
            return True
        by_device: dict[torch.device, list] = {}
        for runner in runners:
            by_device.setdefault(runner.device, []).append(runner)
        for device, here in by_device.items():
            per_example = held = 0
            for runner in here:
                seen = self.counts.get(runner.name)
                per_example += max(runner.ledger.held // in_flight, seen.kv_peak_bytes_per_example if seen else 0)
                held += runner.ledger.held
            if (in_flight + 2) * per_example > here[0].backend.free_memory(device) + held:
                return False
        return True

    def run(self, plans: list[PassPlan], requests: Sequence[Forward | ReadPrompt], examples: int = 1) -> list:
        """Run the plan over the step's requests (in place order); their results in the same order. `examples`:
        how many examples are in flight (the KV per example in the report)."""
        results: list = [None] * len(requests)
        prefixes = [plan for plan in plans if plan.kind == planner.PREFIX]
        if prefixes:
            self._run(prefixes, requests, results)
        self._run([plan for plan in plans if plan.kind != planner.PREFIX], requests, results)
        for runner in {id(r.runner): r.runner for r in requests}.values():
            counts, ledger = self.counts[runner.name], runner.ledger
            counts.kv_peak_bytes = max(counts.kv_peak_bytes, ledger.peak)
            counts.kv_peak_bytes_per_example = max(counts.kv_peak_bytes_per_example, ledger.held // max(examples, 1))
            counts.kv_prefix_bytes = max(counts.kv_prefix_bytes, ledger.prefixes)
        return results

    def _run(self, plans: list[PassPlan], requests, results: list) -> None:
        passes = [self._pass(plan, requests) for plan in plans]
        by_backend: dict[int, tuple] = {}  # per backend: it, and its passes' indices
        for i, plan in enumerate(plans):
            backend = requests[plan.places[0]].runner.backend
            by_backend.setdefault(id(backend), (backend, []))[1].append(i)
        for backend, indices in by_backend.values():
            for i, ran in zip(indices, backend.execute([passes[i] for i in indices], self.how)):
                self._finish(plans[i], passes[i], ran, requests, results)

    def _pass(self, plan: PassPlan, requests) -> Pass:
        """The backend's pass for a plan (its kind decides what each request reads)."""
        first = requests[plan.places[0]]
        if plan.kind == planner.PREFIX:
            ids = first.ids[: first.prefix_length]
            return Pass(PREFIX, first.runner.prepared, (Read(DynamicCache(), _tensor(ids)),))
        return Pass(BACKEND_KIND[plan.kind], first.runner.prepared, tuple(_read(requests[p]) for p in plan.places))

    def _finish(self, plan: PassPlan, done: Pass, ran, requests, results: list) -> None:
        first = requests[plan.places[0]]
        runner = first.runner
        counts = self.counts.setdefault(runner.name, PassCounts(kv_bytes_per_token=runner.kv_bytes_per_token))
        if runner.name not in self.how_met:
            self.how_met[runner.name] = self._way(runner)
        counts.passes += 1
        counts.seconds += ran.seconds
        counts.host_seconds += ran.host_seconds
        if plan.kind == planner.PREFIX:
            (read,) = done.reads
            runner.prompts.add(first.ids[: first.prefix_length], context_cache(read.cache, runner.ledger, frozen=True))
            counts.prefix_passes += 1
            counts.rows += 1
            return
        counts.rows += sum(read.rows for read in done.reads)
        counts.longest_context = max([counts.longest_context] + [read.cache.get_seq_length() for read in done.reads])
        merged = plan.kind == planner.MERGED
        counts.merged_passes += merged
        for place, read, result in zip(plan.places, done.reads, ran.results):
            request = requests[place]
            if isinstance(request, ReadPrompt):
                counts.merged_prompts += merged
                cache = read.cache if request.prefix_length else context_cache(read.cache, runner.ledger)
                results[place] = (cache, result)
            else:
                results[place] = result

    def _way(self, runner) -> dict[str, str]:
        """How a model's passes run, as its backend describes them (`Backend.describe`): the backend's name and
        each op type's way (attention "per_request", "alone", "kernel", "stock"; linear "row_tiles", "kernel",
        "stock"; ...)."""
        described = runner.backend.describe(runner.prepared, self.how.exact)
        return {"backend": described["backend"], **described["ops"]}

    def report(self) -> dict[str, dict]:
        """Per model name, how its requests met and its counts, as plain data (a run's metrics.json):
        {"backend", "attention", "linear", "rms_norm", "log_softmax" (see `_way`), "passes": ..., "merged_passes":
        ..., "rows": ..., "merged_prompts": ..., "prefix_passes": ..., "seconds": ..., "host_seconds": ...,
        "kv_peak_bytes": ..., "kv_peak_bytes_per_example": ..., "kv_prefix_bytes": ..., "kv_bytes_per_token": ...,
        "longest_context": ...}."""
        return {name: self.how_met[name] | asdict(counts) for name, counts in self.counts.items()}


def _read(request: Forward | ReadPrompt) -> Read:
    """What a request reads in a pass: a prompt its tail after its stored prefix (read in place, frozen, so the
    pass writes into a buffer of the prompt's own) or the whole prompt from nothing, for its last logits."""
    if isinstance(request, ReadPrompt):
        runner = request.runner
        if request.prefix_length:
            cache = view_cache(runner.prompts.get(request.ids[: request.prefix_length]))
        else:
            cache = DynamicCache()
        return Read(cache, _tensor(request.ids[request.prefix_length :]), last_only=True)
    return Read(request.cache, request.input_ids, request.lengths, request.last_only, request.logprobs, request.masked)


def _tensor(ids: list[int]) -> torch.Tensor:
    """A pass's ids on the host: the backend moves them to its device."""
    return torch.tensor([ids])
