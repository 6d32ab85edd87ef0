"""A member's context as a value: the committed ids, their KV cache, the next-token distribution after them
and where the last committed word starts; and forks of it read as one batch (`Rows`, `Steps`).

Invariant: the cache holds exactly the KV of `ids`, and `logprobs` is the distribution after `ids` (float32
log-softmax; the model's control tokens, spec §2, at -inf where `mask_control`). The generated text G is not
here: the session keeps it (adafuse/methods/session.py), and the operations that need it are handed it.
"""

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import DynamicCache

from adafuse.member.cache import commit_row, continue_row, fork_cache, select_rows, view_cache
from adafuse.text.align import Alignment, common_prefix


@dataclass
class Context:
    ids: list[int] = field(default_factory=list)
    cache: DynamicCache | None = None
    logprobs: torch.Tensor | None = None
    prompt_text: str = ""  # the prompt as this model reads it (plain, or in its chat template)
    prompt_len: int = 0  # ids before the first one that carries generated text
    anchor: int = 0  # where the last committed word starts in `ids`: a cut-back never reaches before it
    mask_control: bool = True  # control tokens at -inf in every distribution (spec §2); `single` keeps them
    prompt_logits: torch.Tensor | None = None  # the raw logits after the prompt, for a distribution under another mask

    @property
    def generated_ids(self) -> list[int]:
        return self.ids[self.prompt_len :]

    def snapshot(self) -> "Context":
        """This context as it is now, kept while the context goes on: a view of the positions it holds now,
        which later passes never write (they write past them, adafuse/member/cache.py)."""
        return replace(self, cache=view_cache(self.cache))

    def forked_cache(self, n: int, upto: int) -> DynamicCache:
        """n rows that continue the cache's first `upto` positions, read in place (adafuse/member/cache.py)."""
        return fork_cache(self.cache, n, upto)

    def committed(self, ids: list[int], cache: DynamicCache, logprobs: torch.Tensor, anchor: int) -> "Context":
        """This context moved to `ids` (whose KV `cache` holds): a cut-back into the prompt makes the merged
        token part of the output (`prompt_len` shrinks to the ids kept)."""
        kept = common_prefix(self.ids, ids)
        return replace(
            self, ids=list(ids), cache=cache, logprobs=logprobs, prompt_len=min(self.prompt_len, kept), anchor=anchor
        )

    def check_invariant(self, name: str) -> None:
        length = self.cache.get_seq_length()
        if length != len(self.ids):
            raise AssertionError(f"model {name!r}: cache holds {length} tokens but the context has {len(self.ids)}")


class Rows:
    """A batch of continuations of one shared prefix, read together.

    Row i's context is `prefix + tokens[i]`. Rows are right-padded, so a row that stopped early
    (a finished word, a short candidate) keeps padding after its real tokens; causal attention never
    lets a real token see padding, and `cache_of_row` crops it away.
    """

    def __init__(self, member: Any, prefix: list[int], cache: DynamicCache, n: int, last: torch.Tensor | None):
        self.member = member  # adafuse.member.member.Member: whose weights read the rows
        self.prefix = prefix
        self.cache = cache
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.last: list[torch.Tensor | None] = [last] * n  # the distribution after each row's tokens
        self.width = 0  # positions read after the prefix, padding included

    def extend(self, new: list[list[int]]):
        """Read `new[i]` after row i (a program: yields the pass); returns the log-probabilities at each new
        position (`Steps`). A row that gets tokens must not have stopped early before (it would read after its
        padding)."""
        longest = max(len(t) for t in new)
        for i, t in enumerate(new):
            if t and len(self.tokens[i]) != self.width:
                raise AssertionError(f"row {i} stopped early and cannot be extended")
        pad = [t + [t[-1] if t else 0] * (longest - len(t)) for t in new]
        lengths = [len(t) for t in new]
        ids = torch.tensor(pad)  # on the host: the backend moves a pass's ids to its device
        steps = Steps((yield from self.member.forward(self.cache, ids, lengths=lengths, logprobs=True)), lengths)
        for i, t in enumerate(new):
            if t:
                self.tokens[i] = self.tokens[i] + t
                self.last[i] = steps[i, len(t) - 1]
        self.width += longest
        return steps

    def select(self, rows: list[int]) -> "Rows":
        """New rows that copy the given rows, in that order (beam search); this object stays as it was."""
        chosen = Rows(self.member, self.prefix, select_rows(self.cache, rows), 0, None)
        chosen.tokens = [self.tokens[r] for r in rows]
        chosen.last = [self.last[r] for r in rows]
        chosen.width = self.width
        return chosen

    def fork(self, row: int, n: int) -> "Rows":
        """n new rows that continue row `row` (its real tokens, not its padding)."""
        continued = continue_row(self.cache, row, len(self.prefix) + len(self.tokens[row]), n)
        return Rows(self.member, self.prefix + self.tokens[row], continued, n, self.last[row])

    def truncate(self, row: int, length: int, last: torch.Tensor) -> None:
        """Row `row` keeps its first `length` tokens after the prefix; `last` is the distribution after them.

        The row has stopped early: it can be committed, not extended.
        """
        self.tokens[row] = self.tokens[row][:length]
        self.last[row] = last

    def cache_of_row(self, row: int) -> DynamicCache:
        """The context that row `row` makes (its real tokens after the prefix; adafuse/member/cache.py `commit_row`)."""
        return commit_row(self.cache, row, len(self.prefix) + len(self.tokens[row]))


@dataclass
class Reading:
    """An alignment read in a batch (`Member.read`): the log-probability of each scored id, and where its KV lives."""

    alignment: Alignment
    logprobs: list[float]  # log p of alignment.ids[skip:], each in context
    after: torch.Tensor  # the next-token distribution after the last id
    home: tuple[Rows, int]  # the fork row that holds its KV: `Member.commit(*home, ...)` adopts it


class Steps:
    """The log-probabilities one `Rows.extend` computed: `steps[i, j]` is the distribution after the j-th id
    row i read (j < the ids it read; a slice of j gives several, a slice of i stacks rows). The padding
    after a row's ids is never computed (adafuse/backend/live.py): nothing to index there."""

    def __init__(self, packed: torch.Tensor, lengths: list[int]):
        self.packed = packed  # (sum(lengths), vocab), row after row
        self.lengths = lengths
        self.starts = [sum(lengths[:i]) for i in range(len(lengths))]

    @property
    def device(self) -> torch.device:
        return self.packed.device

    def __getitem__(self, key: tuple[int | slice, int | slice]) -> torch.Tensor:
        row, position = key
        if isinstance(row, slice):  # several rows at one position each: stacked
            return torch.stack([self[r, position] for r in range(len(self.lengths))[row]])
        length = self.lengths[row]
        if isinstance(position, slice):
            start, stop, step = position.indices(length)
            return self.packed[self.starts[row] + start : self.starts[row] + stop : step]
        if not -length <= position < length:
            raise IndexError(f"row {row} read {length} ids; there is no position {position}")
        return self.packed[self.starts[row] + position % length]
