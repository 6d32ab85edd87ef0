"""The engine's thread: the one thread that runs the engine loop and touches the models.

The HTTP handlers run on the event loop's thread (serve/app.py). Each request is a `Ticket`: its choices
(one example each). Before a ticket reaches the engine, the prompt-check thread counts each prompt's tokens
for every model, with its own copies of their tokenizers (`Ensemble.prompt_check`): a prompt too long for a
model's context is refused there, and one too long in bytes alone before any tokenizer reads it, so that no
prompt, however large, costs the engine's thread anything. An admitted ticket goes on a thread-safe inbox.
Between two engine steps the engine's thread takes everything in the inbox: it submits the examples, which join
the batch in flight at the next step (continuous batching); it cancels the tickets whose clients left, and
submits the texts that asked for log-probabilities as scoring jobs, which the engine steps beside the
completions like any example (a long text's scoring never stalls the others). Then it runs one step and hands
each finished example, each finished scoring job and each text a session reported as final back to its
ticket's event queue through the event loop (`call_soon_threadsafe`). Nothing in the decode path takes a lock.

Exact merged passes (adafuse/backend/) give every example the bits of its decode alone, whatever else is in
flight: a completion's text does not depend on the server's load.

Shutdown drains: after `drain(grace)` no new ticket is taken; the ones in flight go on, and any still there
when the grace period ends is answered with an error that says so.
"""

import asyncio
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from adafuse import Job, ScoreJob
from adafuse.errors import ContextLengthError, DataError
from serve.protocol import ApiError, Completion

log = logging.getLogger(__name__)

IDLE_POLL_SECONDS = 0.2  # how often an idle engine thread looks at the drain deadline
SCORE = "score"  # a scoring job's place in an engine key, where a completion's choice index goes


@dataclass
class Ticket:
    """One HTTP request's examples, as the handler and the engine's thread share it. The handler reads
    `events` (an asyncio.Queue): ("admitted", prompt_tokens), ("text", choice, final text), ("done", choice,
    Generation), ("failed", ApiError), ("scored", likelihoods)."""

    id: int
    completion: Completion
    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    submitted: float = field(default_factory=time.perf_counter)
    open: int = 0  # choices still decoding (the engine's thread's count)
    prompt_tokens: list = field(default_factory=list)  # per choice, each model's count (`EngineLoop.check`)

    def post(self, *event) -> None:
        """Hand the handler an event, from the engine's thread."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class Counters:
    """What /metrics reports of the engine, as the engine's thread last left it."""

    queued: int = 0  # examples waiting for a slot
    in_flight: int = 0
    examples: int = 0  # examples finished
    example_seconds: float = 0.0  # their seconds from submission to the end, summed
    failed: int = 0
    cancelled: int = 0  # examples dropped from the engine before their end
    passes: dict = field(default_factory=dict)  # per model name: Executor.report()'s counts


class EngineLoop:
    """Owns the ensemble's engine and its thread. From the event loop, `open` takes a request or refuses it at
    once (queue full: 429; shutting down: 503), `check` counts its prompts' tokens on the prompt-check thread,
    and `admit` hands it to the engine; everything after that goes through the inbox."""

    def __init__(self, ensemble, *, batch_size: int, queue_limit: int):
        self._ensemble = ensemble
        self._batch_size = batch_size
        self._engine = ensemble.engine(batch_size=batch_size)
        self._prompt_check = ensemble.prompt_check()  # its own tokenizers, for its own thread
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adafuse-prompt-check")
        # in flight and waiting together: more are refused at once (429), never left to hang
        self.capacity = batch_size + queue_limit
        self._outstanding = 0  # choices taken and not yet over: only the event loop's thread counts them
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._tickets: dict[int, Ticket] = {}  # by id, the engine's thread's own
        self._ids = itertools.count()
        self._deadline: float | None = None  # when draining: the end of the grace period
        self.counters = Counters()
        self._thread = threading.Thread(target=self._run, name="adafuse-engine", daemon=True)

    # ---- the event loop's side --------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def draining(self) -> bool:
        return self._deadline is not None

    def open(self, completion: Completion) -> Ticket:
        """A ticket for the request, its room among the completions held for it; ApiError if it cannot be taken
        now. Then `check` it, and `admit` it or give it back (`close_ticket`)."""
        if self.draining:
            raise ApiError(503, "the server is shutting down and takes no new requests")
        choices = len(completion.requests)
        if self._outstanding + choices > self.capacity:
            raise ApiError(
                429,
                f"the server is full ({self._outstanding} completions decoding or queued, room for {self.capacity}"
                f"): retry later",
            )
        self._outstanding += choices
        return Ticket(next(self._ids), completion, asyncio.Queue(), asyncio.get_running_loop())

    async def check(self, ticket: Ticket) -> None:
        """Count each prompt's tokens for every model (the ticket's `prompt_tokens`) on the prompt-check thread;
        ApiError 400 naming the prompt if one leaves some model too little of its context."""
        completion = ticket.completion
        try:
            ticket.prompt_tokens = await ticket.loop.run_in_executor(
                self._checker,
                lambda: [self._prompt_check.lengths(r.prompt, completion.reserve) for r in completion.requests],
            )
        except (ContextLengthError, DataError) as err:
            raise ApiError(400, str(err), "prompt") from None

    def admit(self, ticket: Ticket) -> None:
        """Hand a checked ticket to the engine: its examples join the batch in flight at the next step."""
        self._inbox.put(("admit", ticket))

    def close_ticket(self, ticket: Ticket, finished: bool) -> None:
        """The handler is done with the ticket; if it did not see every choice end (its client left, or an
        error), its examples are dropped from the engine."""
        self._outstanding -= len(ticket.completion.requests)
        if not finished:
            self._inbox.put(("cancel", ticket))

    def score(self, ticket: Ticket, pairs: list[tuple[str, str]]) -> None:
        """Ask for the ensemble's log-likelihood of each (context, continuation): a ("scored", ...) event."""
        self._inbox.put(("score", ticket, pairs))

    def drain(self, grace: float) -> None:
        """Take no new requests; fail those still decoding after `grace` seconds. Safe in a signal handler: it
        only sets a number that both threads read."""
        if self._deadline is None:
            self._deadline = time.monotonic() + grace

    def stop(self) -> None:
        """End the engine's thread (after the last response) and close the engine."""
        self._inbox.put(("stop",))
        self._thread.join()
        self._checker.shutdown(wait=False, cancel_futures=True)

    # ---- the engine's thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            commands = []
            if not self._engine.busy:  # idle: wait for work, looking at the drain deadline now and then
                try:
                    commands.append(self._inbox.get(timeout=IDLE_POLL_SECONDS))
                except queue.Empty:
                    pass
            while True:  # everything that arrived during the last step joins before the next one
                try:
                    commands.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for command in commands:
                if command[0] == "stop":
                    self._fail_all(ApiError(503, "the server stopped"))
                    self._engine.close()
                    return
                self._obey(*command)
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._fail_all(ApiError(503, "the server is shutting down: the grace period for requests ended"))
            if self._engine.busy:
                self._step()
            self._publish()

    def _obey(self, name: str, ticket: Ticket, *args) -> None:
        """Run one command of the inbox; an error it raises is its ticket's answer, and this thread goes on."""
        try:
            getattr(self, f"_{name}")(ticket, *args)
        except Exception as err:  # noqa: BLE001 - whatever failed, the request gets it and the server stays up
            log.exception("%s failed", name)
            self._tickets.pop(ticket.id, None)
            ticket.post("failed", ApiError(500, f"{name} failed ({type(err).__name__}: {err})"))

    def _admit(self, ticket: Ticket) -> None:
        completion = ticket.completion
        self._tickets[ticket.id] = ticket
        ticket.open = len(completion.requests)
        for choice, request in enumerate(completion.requests):
            heard = _listener(ticket, choice) if completion.stream else None
            self._engine.submit((ticket.id, choice), Job(request, completion.method, completion.config, heard))
        ticket.post("admitted", ticket.prompt_tokens)

    def _cancel(self, ticket: Ticket) -> None:
        if self._tickets.pop(ticket.id, None) is not None:
            self.counters.cancelled += self._cancel_rest(ticket)

    def _score(self, ticket: Ticket, pairs: list[tuple[str, str]]) -> None:
        """Submit the scoring of `pairs` as a job of the engine's: its likelihoods come back from a step."""
        self._tickets[ticket.id] = ticket
        self._engine.submit((ticket.id, SCORE), ScoreJob(tuple(pairs)))

    def _step(self) -> None:
        try:
            finished = self._engine.step()
        except Exception as err:  # noqa: BLE001 - a pass failed (out of memory, ...): every example in it is lost
            log.exception("an engine step failed; every request in flight ends with its error")
            self._fail_all(ApiError(500, f"the engine failed ({type(err).__name__}: {err}); retry the request"))
            self._engine.close()
            self._engine = self._ensemble.engine(batch_size=self._batch_size)
            return
        now = time.perf_counter()
        for (ticket_id, choice), result in finished:
            ticket = self._tickets.get(ticket_id)
            if ticket is None:
                continue
            if choice == SCORE:
                self._tickets.pop(ticket_id)
                if isinstance(result, BaseException):
                    ticket.post("failed", ApiError(500, f"scoring failed ({type(result).__name__}: {result})"))
                else:
                    ticket.post("scored", result)
                continue
            if isinstance(result, BaseException):
                self.counters.failed += 1
                self._tickets.pop(ticket_id)
                self._cancel_rest(ticket)
                ticket.post("failed", ApiError(500, f"decoding failed ({type(result).__name__}: {result})"))
                continue
            self.counters.examples += 1
            self.counters.example_seconds += now - ticket.submitted
            ticket.open -= 1
            if ticket.open == 0:
                self._tickets.pop(ticket_id)
            ticket.post("done", choice, result)

    def _cancel_rest(self, ticket: Ticket) -> int:
        """Drop the ticket's examples still queued or decoding, and its scoring job if it has one: how many
        examples there were."""
        self._engine.cancel((ticket.id, SCORE))
        return sum(self._engine.cancel((ticket.id, choice)) for choice in range(len(ticket.completion.requests)))

    def _fail_all(self, error: ApiError) -> None:
        for ticket in list(self._tickets.values()):
            self._cancel_rest(ticket)
            ticket.post("failed", error)
        self._tickets.clear()

    def _publish(self) -> None:
        engine = self._engine
        self.counters.queued = len(engine.queue)
        self.counters.in_flight = engine.in_flight
        self.counters.passes = engine.report()


def _listener(ticket: Ticket, choice: int):
    """What a choice's session calls with its final text: the handler streams the new part."""

    def heard(text: str) -> None:
        ticket.post("text", choice, text)

    return heard
