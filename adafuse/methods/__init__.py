"""The method seam: a decoding method by name, and the one way every method is run.

A method is a program written once per example, `decode(session, cfg)`, that fills the session's shared text
(adafuse/methods/session.py), yielding the forward passes it needs (adafuse/member/passes.py), with the dataclass of
its knobs, `positions_needed(cfg, max_new_tokens)` (the context it may use after the prompt) and `members_used(cfg,
k)` (which of the pair's k models it decodes with; the runner loads only those). `Method.generate(members, request,
cfg)` is the program that builds the session from a `Request`, starts it and runs the method: the engine
(adafuse/engine/loop.py) runs it, alone or beside other examples.

Methods are found through the packaging entry-point group `adafuse.methods` (pyproject.toml), loaded
on first lookup: the engine never imports the baselines (or any other package that adds a method).
"""

from collections.abc import Callable
from dataclasses import dataclass

from adafuse.member.passes import Program
from adafuse.methods.session import Request, Session
from adafuse.registry import Registry


def every_member(cfg, available: int) -> list[int]:
    return list(range(available))


@dataclass(frozen=True)
class Method:
    config: type  # the dataclass of its knobs (range-checked in __post_init__)
    decode: Callable[[Session, object], Program]
    positions_needed: Callable[[object, int], int]
    members_used: Callable[[object, int], list[int]] = every_member
    raw_distribution: bool = False  # keep control tokens in the distribution (`single` equals generate())

    def generate(self, members: list, request: Request, cfg, on_text: Callable[[str], None] | None = None) -> Program:
        """The program that decodes one request with the members this method uses (indices into `members`);
        it returns the Generation. `on_text` is called with the generated text each time it changes
        (`Session`)."""
        used = [members[i] for i in self.members_used(cfg, len(members))]
        reserve = self.positions_needed(cfg, request.max_new_tokens)
        session = Session(used, request, reserve=reserve, mask_control=not self.raw_distribution, on_text=on_text)
        yield from session.start()
        yield from self.decode(session, cfg)
        return session.finish()


METHODS = Registry("method", entry_points="adafuse.methods")
