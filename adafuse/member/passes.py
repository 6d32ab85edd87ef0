"""The forward passes a decoder asks for, as data, and how a decoder asks for several at once.

A method is per-example code in the order of its paper, written as a generator: where it needs a forward
pass it yields a request and receives the pass's result, `logits = yield Forward(...)`; helpers pass them on
with `yield from`. It never runs a model itself. A request is plain data: the weights (a runner), the context
it reads after and the ids to read. The engine (adafuse/engine/) collects what every example in flight waits
on, plans the passes, has the backend run them and hands each example its results.

A program may yield one request or a list of them; a list is answered with the list of their results, in
order. "Both models at once" is one list: `together` runs several programs in lockstep, so that an example's
members ask for their passes in the same engine step, where different models' passes can run side by side
and each model's requests meet the other examples' in one merged pass.
"""

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from adafuse.backend import Read

Program = Generator[Any, Any, Any]  # yields Forward / ReadPrompt (or lists of them), returns its result


@dataclass(eq=False)
class Forward:
    """A read with `runner`'s weights: `read` (adafuse/backend/interface.py `Read`: its ids after its cache, which grows
    by them, and what comes back: float32 logits, (rows, width, vocab); packed, (sum(lengths), vocab), with lengths;
    the last position's alone with `last_only`; their log-softmax, the member's control tokens at -inf, with
    `logprobs`). The engine hands the read to the backend as it is."""

    runner: Any  # adafuse.member.runner.Runner: whose weights
    read: Read

    @property
    def rows(self) -> int:
        return self.read.rows


@dataclass(eq=False)
class ReadPrompt:
    """Read a prompt's `ids` from nothing with `runner`'s weights, its first `prefix_length` ids (its declared shared
    prefix, adafuse/member/member.py `Member.prefix_length`) from the runner's store of prefixes, read once
    for all the prompts that share them: the prompt's context cache, and its last position's logits (1, 1, vocab)."""

    runner: Any
    ids: list[int]
    prefix_length: int = 0
    room: int = 0  # positions the context may grow by after the prompt (its buffer holds them from the start)

    @property
    def rows(self) -> int:
        return 1


def together(programs: list[Program]) -> Program:
    """Run the programs in lockstep and return their results in order: each step yields, as one list, the
    next requests of every program not yet finished (in program order), and hands each its own results. A
    program that fails ends the others (closed, nothing left waiting) and its error is raised."""
    results: list[Any] = [None] * len(programs)
    waiting: dict[int, tuple[list, bool]] = {}  # program -> (its requests, whether it yielded a list)

    def advance(i: int, value) -> None:
        try:
            asked = programs[i].send(value)
        except StopIteration as done:
            results[i] = done.value
            return
        waiting[i] = (asked, True) if isinstance(asked, list) else ([asked], False)

    try:
        for i in range(len(programs)):
            advance(i, None)
        while waiting:
            order = sorted(waiting)
            answers = yield [request for i in order for request in waiting[i][0]]
            at = 0
            for i in order:
                asked, listed = waiting.pop(i)
                mine = answers[at : at + len(asked)]
                at += len(asked)
                advance(i, mine if listed else mine[0])
    finally:
        for program in programs:
            program.close()
    return results
