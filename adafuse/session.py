"""One example's decode, whatever the method: the request, the members started on its prompt, the
shared generated text G, the statistics, and the stop rule of spec §5. Methods own only their algorithm.

A `Request` is what the runner and the Python API hand to a method (as lm-evaluation-harness's
`Instance` travels from task to model); the method seam (`adafuse.methods.Method.generate`) builds the
`Session` from it, and the method reads its settings from there.
"""

import copy
import time
from dataclasses import dataclass, replace

from adafuse.model import Member
from adafuse.stopping import check_budget, cut_at_stop, stop_strings
from adafuse.trace import Generation, Stats, Trace


@dataclass(frozen=True)
class Request:
    """One example: its prompt, the stop strings that end it, its token budget, and whether to trace it."""

    prompt: str
    stop: tuple[str, ...] = ()  # one string or several; G is cut before the first one found
    max_new_tokens: int = 64  # generated tokens of any one member (spec §5)
    trace: bool = False  # record each round (spec §7) in the Generation

    def __post_init__(self):
        object.__setattr__(self, "stop", stop_strings(self.stop))
        check_budget(self.max_new_tokens)

    @classmethod
    def of(cls, prompt: "str | Request", **fields) -> "Request":
        """`prompt` as a Request: a Request as it is (with `fields` replaced), a string with `fields`."""
        if isinstance(prompt, Request):
            return replace(prompt, **fields) if fields else prompt
        return cls(prompt, **fields)


class Session:
    def __init__(self, members: list[Member], request: Request, *, reserve: int, mask_control: bool = True):
        """Start every member on the request's prompt. `reserve` is the context the method may use after
        it; `mask_control=False` keeps control tokens in the distribution (`single`, spec §2)."""
        self.started = time.perf_counter()
        self.members = members
        self.request = request
        for m in members:
            m.reset_counters()
            m.start(request.prompt, reserve=reserve, mask_control=mask_control)
        self.text = ""
        self.stats = Stats()
        self.record = Trace(prompt_ids=[list(m.ids) for m in members]) if request.trace else None
        self.output_ids: list[list[int]] | None = None  # set by a method whose output ids are not all read

    @property
    def stop(self) -> tuple[str, ...]:
        return self.request.stop

    @property
    def max_new_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def done(self) -> bool:
        return bool(self.stats.stop_reason)

    def solo(self, k: int) -> "Session":
        """A session of member k alone on the same request, from where it stands (not started again)."""
        alone = copy.copy(self)
        alone.started = time.perf_counter()
        alone.members = [self.members[k]]
        alone.text, alone.stats, alone.output_ids = "", Stats(), None
        alone.record = Trace(prompt_ids=[list(self.members[k].ids)]) if self.request.trace else None
        return alone

    def add(self, new: str, eos: bool = False, unread: int = 0) -> bool:
        """Append one step's text to G and apply the stop rules; True once decoding must stop.

        A stop string cuts G before it; `eos` means the step ended at end-of-sequence; the budget is
        used up once any member has `max_new_tokens` generated tokens, counting `unread` ones it has
        chosen but not read yet (greedy decoding never reads its last token).
        """
        self.stats.rounds += 1
        self.text, cut = cut_at_stop(self.text, new, self.stop)
        if cut:
            self.stats.stop_reason = "stop"
        elif eos:
            self.stats.stop_reason = "eos"
        elif any(len(m.generated_ids) + unread >= self.max_new_tokens for m in self.members):
            self.stats.stop_reason = "length"
        return self.done

    def end_early(self, text: str) -> None:
        """End in a round that was not completed: every candidate it could have chosen cuts G to `text`
        at a stop string (adafuse/decode.py `RoundEnd`). Nothing is committed, so each member's output
        ids are those of the rounds before, and `rounds` counts only rounds with a winner."""
        self.text = text
        self.stats.stop_reason = "stop"
        self.stats.early_finish = True

    def finish(self) -> Generation:
        """The Generation: G, stats with each member's token counts, and the trace if one was kept."""
        ids = [list(m.generated_ids) for m in self.members] if self.output_ids is None else self.output_ids
        self.stats.tokens_generated = [len(i) for i in ids]
        self.stats.tokens_fed = [m.tokens_fed for m in self.members]
        self.stats.forward_passes = [m.forward_passes for m in self.members]
        self.stats.seconds = time.perf_counter() - self.started
        return Generation(text=self.text, stats=self.stats, ids=ids, trace=self.record)
