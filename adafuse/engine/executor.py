"""The executor: runs a step's plan (adafuse/engine/scheduler.py) as the backend takes it (adafuse/backend/: `Pass`es of
`Read`s), and hands each request its result. It decides nothing: which requests meet, and in which kind of pass, is
the plan; what a prompt reads, and what its read leaves, the member's runner says (adafuse/member/runner.py).

PREFIX passes run first (each keeps its prefix in the runner's store, frozen: every prompt that starts with it reads
it in place), then the rest. A prompt's result is its context cache and its last position's logits.

It counts each model's passes, rows and seconds, and reports how each model's backend runs them (`report`).
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from adafuse.backend import MERGED, PREFIX, Execution, Pass
from adafuse.engine.scheduler import PassPlan
from adafuse.member.passes import Forward, ReadPrompt


@dataclass
class PassCounts:
    """One model's forward passes (a prompt read is one pass of one row)."""

    passes: int = 0
    merged_passes: int = 0  # passes that carried the requests of more than one example
    rows: int = 0  # rows over all passes
    merged_prompts: int = 0  # prompts whose tail was read in a merged pass
    prefix_passes: int = 0  # shared prompt prefixes read (once each, for every prompt that starts with them)
    # its passes' time, log-softmax included (on a CPU, on its own thread beside the other model's passes; on a GPU,
    # what the GPU spent, from each pass's first kernel to its last), and what the host took to run or launch them
    seconds: float = 0.0
    host_seconds: float = 0.0


class Executor:
    """Runs each step's plan and counts the passes per model. `exact` (the default): every request's numbers
    are those of its pass alone; `options`: each backend's own settings, by device type (adafuse/backend/
    interface.py `Execution`)."""

    def __init__(self, exact: bool = True, options: dict | None = None):
        self.how = Execution(exact, options or {})
        self.counts: dict[str, PassCounts] = {}  # per model name, in the order models first ran
        self.ways: dict[str, dict[str, str]] = {}  # per model name: how its backend runs its passes (`_way`)

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

    def run(self, plans: list[PassPlan], requests: Sequence[Forward | ReadPrompt]) -> list:
        """Run the plan over the step's requests (in place order); their results in the same order."""
        results: list = [None] * len(requests)
        prefixes = [plan for plan in plans if plan.kind == PREFIX]
        if prefixes:
            self._run(prefixes, requests, results)
        self._run([plan for plan in plans if plan.kind != PREFIX], requests, results)
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
        """The backend's pass for a plan: each request's read, as it is (a prompt's as its runner makes it)."""
        first = requests[plan.places[0]]
        if plan.kind == PREFIX:
            return Pass(PREFIX, first.runner.prepared, (first.runner.prefix_read(first),))
        reads = (
            requests[p].runner.prompt_read(requests[p]) if isinstance(requests[p], ReadPrompt) else requests[p].read
            for p in plan.places
        )
        return Pass(plan.kind, first.runner.prepared, tuple(reads))

    def _finish(self, plan: PassPlan, done: Pass, ran, requests, results: list) -> None:
        first = requests[plan.places[0]]
        runner = first.runner
        counts = self.counts.setdefault(runner.name, PassCounts())
        if runner.name not in self.ways:
            self.ways[runner.name] = self._way(runner)
        counts.passes += 1
        counts.seconds += ran.seconds
        counts.host_seconds += ran.host_seconds
        counts.rows += sum(read.rows for read in done.reads)
        if plan.kind == PREFIX:
            runner.keep_prefix(first, done.reads[0])
            counts.prefix_passes += 1
            return
        merged = plan.kind == MERGED and len(plan.places) > 1
        counts.merged_passes += merged
        for place, read, result in zip(plan.places, done.reads, ran.results):
            request = requests[place]
            if isinstance(request, ReadPrompt):
                counts.merged_prompts += merged
                results[place] = (runner.prompt_context(request, read), result)
            else:
                results[place] = result

    def _way(self, runner) -> dict[str, str]:
        """How a model's passes run, as its backend describes them (`Backend.describe`): the backend's name and
        each op type's way (attention "per_request", "alone", "kernel", "stock"; linear "row_tiles", "kernel",
        "stock"; ...)."""
        described = runner.describe(self.how.exact)
        return {"backend": described["backend"], **described["ops"]}

    def report(self) -> dict[str, dict]:
        """Per model name, how its passes ran and its counts, as plain data: {"backend", "attention", "linear",
        "rms_norm", "log_softmax" (see `_way`), "passes", "merged_passes", "rows", "merged_prompts",
        "prefix_passes", "seconds", "host_seconds"}."""
        return {name: self.ways[name] | asdict(counts) for name, counts in self.counts.items()}
