"""One example's decode, whatever the method: the request, the members started on its prompt, the
shared generated text G, the statistics, and the stop rule of spec §5. Methods own only their algorithm.

A `Request` is what the runner and the Python API hand to a method (as lm-evaluation-harness's
`Instance` travels from task to model); the method seam (`adafuse.methods.Method.generate`) builds the
`Session` from it, and the method reads its settings from there.
"""

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from adafuse.member.member import Member
from adafuse.member.passes import together
from adafuse.methods.stopping import check_budget, cut_at_stop, settled_length, stop_strings
from adafuse.trace import Generation, RoundTrace, Stats, Trace


@dataclass(frozen=True)
class Request:
    """One example: its prompt, the stop strings that end it, its token budget, whether to trace it, and the
    start of its prompt that other requests share."""

    prompt: str
    stop: tuple[str, ...] = ()  # one string or several; G is cut before the first one found
    max_new_tokens: int = 64  # generated tokens of any one member (spec §5)
    trace: bool = False  # record each round (spec §7) in the Generation
    # A start of `prompt` that other requests share (a task's instruction and exemplars): each member reads it
    # once and keeps it for them (`Member.prefix_length`). Without it the whole prompt is read for each request.
    prefix: str = ""

    def __post_init__(self):
        object.__setattr__(self, "stop", stop_strings(self.stop))
        check_budget(self.max_new_tokens)
        if not self.prompt.startswith(self.prefix):
            raise ValueError(f"Request.prefix {self.prefix[:40]!r}... is not the start of the prompt")

    @classmethod
    def of(cls, prompt: "str | Request", **fields) -> "Request":
        """`prompt` as a Request: a Request as it is (with `fields` replaced), a string with `fields`."""
        if isinstance(prompt, Request):
            return replace(prompt, **fields) if fields else prompt
        return cls(prompt, **fields)


def through_last_blank_line(text: str) -> str:
    """`text` through its last blank line, "" if it has none: what few-shot prompts share where their
    exemplars and query are joined by blank lines (lm_eval's few-shot delimiter, this project's tasks)."""
    return text[: text.rfind("\n\n") + 2] if "\n\n" in text else ""


STOP_REASONS = ("stop", "eos", "length")  # a stop string, end-of-sequence, the token budget (Stats.stop_reason)


class Session:
    """The one keeper of an example's decode state: G, the statistics, the stop reason and the trace.

    A method reads them through read-only properties and changes them only through the methods below
    (`add`, or `append` and `end` for a method with stop rules of its own; `note`, `log`,
    `set_output_ids`); tests/unit/test_seams.py holds every method to that.
    """

    def __init__(
        self,
        members: list[Member],
        request: Request,
        *,
        reserve: int,
        mask_control: bool = True,
        on_text: Callable[[str], None] | None = None,
    ):
        """A session of `members` on the request; `start` reads its prompt. `reserve` is the context the
        method may use after it; `mask_control=False` keeps control tokens in the distribution (`single`,
        spec §2). `on_text`, if given, is called with the start of G that is final each time it grows: the
        part no stop string can cut any more (`settled_length`), and all of G once decoding ends. A server
        streams it; no method knows it is there."""
        self._started = time.perf_counter()
        self._members = members
        self._request = request
        self._reserve = reserve
        self._mask_control = mask_control
        self._on_text = on_text
        self._text = ""
        self._reported = 0  # how much of G `on_text` has been given
        self._stats = Stats()
        self._trace: Trace | None = None
        self._output_ids: list[list[int]] | None = None  # set by a method whose output ids are not all read

    def start(self):
        """Start every member on the request's prompt, all in the same passes (a program)."""
        request = self._request
        for m in self._members:
            m.reset_counters()
        yield from together(
            [m.start(request.prompt, self._reserve, self._mask_control, request.prefix) for m in self._members]
        )
        if request.trace:
            self._trace = Trace(prompt_ids=[list(m.ids) for m in self._members])

    @property
    def members(self) -> list[Member]:
        return self._members

    @property
    def request(self) -> Request:
        return self._request

    @property
    def stop(self) -> tuple[str, ...]:
        return self._request.stop

    @property
    def max_new_tokens(self) -> int:
        return self._request.max_new_tokens

    @property
    def text(self) -> str:
        """G, the text generated so far."""
        return self._text

    @property
    def rounds(self) -> int:
        """Rounds (or steps) appended so far: the index of the next one."""
        return self._stats.rounds

    @property
    def done(self) -> bool:
        return bool(self._stats.stop_reason)

    @property
    def tracing(self) -> bool:
        """Whether the request asked for a trace (build what `log` records only then)."""
        return self._trace is not None

    def solo(self, k: int) -> "Session":
        """A session of member k alone on the same request, from where it stands (not started again)."""
        alone = copy.copy(self)
        alone._started = time.perf_counter()
        alone._members = [self._members[k]]
        alone._text, alone._stats, alone._output_ids = "", Stats(), None
        alone._on_text, alone._reported = None, 0  # a member's answer is not G: the session it feeds reports G
        alone._trace = Trace(prompt_ids=[list(self._members[k].ids)]) if self.tracing else None
        return alone

    def add(self, new: str, eos: bool = False, unread: int = 0, words: int | None = None) -> bool:
        """Append one step's text to G and apply the stop rules; True once decoding must stop.

        A stop string cuts G before it; `eos` means the step ended at end-of-sequence; the budget is
        used up once any member has `max_new_tokens` generated tokens, counting `unread` ones it has
        chosen but not read yet (greedy decoding never reads its last token). `words`: see `append`.
        """
        if self.append(new, words):
            self.end("stop")
        elif eos:
            self.end("eos")
        elif any(len(m.generated_ids) + unread >= self.max_new_tokens for m in self._members):
            self.end("length")
        return self.done

    def append(self, new: str, words: int | None = None) -> bool:
        """Append one round's text to G, cut before the first stop string; True if one cut it. `words`,
        if given, is the round's count of words (`Stats.words_per_round`). A method whose other stop
        rules are its own (adafuse_code) calls this and then `end`; every other method calls `add`."""
        self._stats.rounds += 1
        if words is not None:
            self._stats.words_per_round.append(words)
        self._text, cut = cut_at_stop(self._text, new, self.stop)
        self._report()
        return cut

    def end(self, reason: str) -> None:
        """Stop decoding for `reason`, one of STOP_REASONS."""
        if reason not in STOP_REASONS:
            raise ValueError(f"a stop reason is one of {STOP_REASONS}, got {reason!r}")
        self._stats.stop_reason = reason
        self._report()

    def note(self, **facts) -> None:
        """Report facts of this example in `Stats.notes` (LLM-Blender's chosen member, the authors' pred)."""
        self._stats.notes.update(facts)

    def log(self, step) -> None:
        """Record one step of a method other than AdaFuse in the trace (`Trace.steps`), if tracing."""
        if self._trace is not None:
            self._trace.steps.append(step)

    def log_round(self, round_: RoundTrace) -> None:
        """Record one AdaFuse round in the trace (`Trace.rounds`, spec §7), if tracing."""
        if self._trace is not None:
            self._trace.rounds.append(round_)

    def set_output_ids(self, ids: list[list[int]]) -> None:
        """Each member's output ids, for a method whose members have not read all of them (their own
        `generated_ids` otherwise)."""
        self._output_ids = ids

    def end_early(self, text: str) -> None:
        """End in a round that was not completed: every candidate it could have chosen cuts G to `text`
        at a stop string (adafuse/methods/adafuse.py `RoundEnd`). Nothing is committed, so each member's output
        ids are those of the rounds before, and `rounds` counts only rounds with a winner."""
        self._text = text
        self.end("stop")
        self._stats.early_finish = True

    def _report(self) -> None:
        """Give `on_text` the final start of G if it grew (every later G starts with it: `settled_length`)."""
        if self._on_text is None:
            return
        final = len(self._text) if self.done else settled_length(self._text, self.stop)
        if final > self._reported:
            self._reported = final
            self._on_text(self._text[:final])

    def finish(self) -> Generation:
        """The Generation: G, stats with each member's token counts, and the trace if one was kept."""
        members = self._members
        ids = [list(m.generated_ids) for m in members] if self._output_ids is None else self._output_ids
        self._stats.tokens_generated = [len(i) for i in ids]
        self._stats.tokens_fed = [m.tokens_fed for m in members]
        self._stats.forward_passes = [m.forward_passes for m in members]
        self._stats.seconds = time.perf_counter() - self._started
        return Generation(text=self._text, stats=self._stats, ids=ids, trace=self._trace)
