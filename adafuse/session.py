"""One example's decode, whatever the method: members started on the prompt, the shared generated
text G, the statistics, and the stop rule of spec §5. Methods own only their algorithm."""

import time

from adafuse.model import Member
from adafuse.stopping import check_budget, cut_at_stop, stop_strings
from adafuse.trace import Generation, Stats, Trace


class Session:
    def __init__(
        self,
        members: list[Member],
        prompt: str,
        *,
        reserve: int,
        stop=(),
        max_new_tokens: int = 64,
        trace: bool = False,
        mask_control: bool = True,
    ):
        self.started = time.perf_counter()
        self.members = members
        self.stop = stop_strings(stop)
        self.max_new_tokens = check_budget(max_new_tokens)
        for m in members:
            m.reset_counters()
            m.start(prompt, reserve=reserve, mask_control=mask_control)
        self.text = ""
        self.stats = Stats()
        self.record = Trace(prompt_ids=[list(m.ids) for m in members]) if trace else None

    @property
    def done(self) -> bool:
        return bool(self.stats.stop_reason)

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

    def finish(self, ids: list[list[int]] | None = None) -> Generation:
        """The Generation: G, stats with each member's token counts, and the trace if one was kept.

        `ids` overrides the members' generated ids (a method whose output ids are not all read).
        """
        ids = [list(m.generated_ids) for m in self.members] if ids is None else ids
        self.stats.tokens_generated = [len(i) for i in ids]
        self.stats.tokens_fed = [m.tokens_fed for m in self.members]
        self.stats.forward_passes = [m.forward_passes for m in self.members]
        self.stats.seconds = time.perf_counter() - self.started
        return Generation(text=self.text, stats=self.stats, ids=ids, trace=self.record)
