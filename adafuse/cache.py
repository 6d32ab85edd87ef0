"""KV-cache mechanics under the member (adafuse/model.py): caches derived as views, the prompts a
member's clones share, and forks of the committed context read as one batch (`Rows`).
"""

from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

if TYPE_CHECKING:  # a fork reads through its member; the member module imports this one
    from adafuse.model import Member


def derive_cache(cache: DynamicCache, view) -> DynamicCache:
    """A new cache whose every key and value tensor, shape (batch, heads, length, head_dim), is `view(tensor)`.

    Views (slices, expand) copy nothing; the first forward pass that reads after them copies them once
    into a buffer of the cache's own (`GrowingLayer`).

    All layers are full-length, also for sliding-window models (Gemma 3): the model still applies its
    window through the attention mask, and a full layer can be cropped anywhere, which rolling back a
    rejected word needs (a sliding layer refuses once the window is full).
    """
    derived = DynamicCache()
    for source in cache.layers:
        derived.layers.append(GrowingLayer(view(source.keys), view(source.values)))
    return derived


class GrowingLayer(DynamicLayer):
    """A cache layer that grows in place: new keys and values are written into a buffer with room after the
    filled positions (`DynamicLayer.update` concatenates, copying the whole layer at every pass; a fork
    of three rows read word by word copied its prompt's keys at every step). `keys` and `values` are
    views of the filled positions.

    Writing in place is safe because a write only ever goes past the filled positions, which no view
    handed out covers: views of this layer (a fork, a row, a stored prompt) are made of its filled
    positions. Where `keys` is not the view this layer last filled (it was given views of another's
    tensors, or cropped, or replaced), the next update first copies it into a new buffer of its own."""

    ROOM = 64  # positions of room a new buffer gets after what it must hold

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        self._filled: torch.Tensor | None = None  # the keys view of our own buffer, as last filled

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        length = self.keys.shape[-2]
        end = length + key_states.shape[-2]
        if self.keys is not self._filled or end > self._key_buffer.shape[-2]:
            shape = (*self.keys.shape[:2], end + self.ROOM, self.keys.shape[-1])
            self._key_buffer = self.keys.new_empty(shape)
            self._value_buffer = self.values.new_empty((*shape[:3], self.values.shape[-1]))
            self._key_buffer[:, :, :length] = self.keys
            self._value_buffer[:, :, :length] = self.values
        self._key_buffer[:, :, length:end] = key_states
        self._value_buffer[:, :, length:end] = value_states
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        self._filled = self.keys
        return self.keys, self.values


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists (list slices compare in C; bisect on a miss)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PromptStore:
    """The KV of the shared prompt prefixes (a task's instruction and exemplars: `Member.prompt_reading`) that
    a member's clones read, shared by the clones: a prefix is read once, not once per example or slot. Four,
    the last used kept: examples of two or three tasks in flight at once (a mixed queue, as the benchmark's)
    each keep their task's prefix. A stored cache is only ever read (its users get views of it)."""

    def __init__(self, size: int = 4):
        self.entries: list[tuple[list[int], DynamicCache]] = []
        self.size = size

    def get(self, ids: list[int]) -> DynamicCache | None:
        """The stored KV of exactly `ids`, now the last used; None if it is not stored."""
        for i, (stored_ids, cache) in enumerate(self.entries):
            if stored_ids == ids:
                self.entries.insert(0, self.entries.pop(i))
                return cache
        return None

    def add(self, ids: list[int], cache: DynamicCache) -> None:
        self.entries = [(list(ids), cache)] + self.entries
        del self.entries[self.size :]


class Rows:
    """A batch of continuations of one shared prefix, read together.

    Row i's context is `prefix + tokens[i]`. Rows are right-padded, so a row that stopped early
    (a finished word, a short candidate) keeps padding after its real tokens; causal attention never
    lets a real token see padding, and `cache_of_row` crops it away.
    """

    def __init__(self, member: "Member", prefix: list[int], cache: DynamicCache, n: int):
        self.member = member
        self.prefix = prefix
        self.cache = cache
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.last: list[torch.Tensor | None] = [member.logprobs if len(prefix) == len(member.ids) else None] * n
        self.width = 0  # positions read after the prefix, padding included

    def extend(self, new: list[list[int]]) -> "Steps":
        """Read `new[i]` after row i; returns the log-probabilities at each new position (`Steps`).

        A row that gets tokens must not have stopped early before (it would read after its padding).
        """
        longest = max(len(t) for t in new)
        for i, t in enumerate(new):
            if t and len(self.tokens[i]) != self.width:
                raise AssertionError(f"row {i} stopped early and cannot be extended")
        pad = [t + [t[-1] if t else 0] * (longest - len(t)) for t in new]
        lengths = [len(t) for t in new]
        ids = torch.tensor(pad, device=self.member.device)
        steps = Steps(self.member._forward(self.cache, ids, lengths=lengths, logprobs=True), lengths)
        for i, t in enumerate(new):
            if t:
                self.tokens[i] = self.tokens[i] + t
                self.last[i] = steps[i, len(t) - 1]
        self.width += longest
        return steps

    def select(self, rows: list[int]) -> "Rows":
        """New rows that copy the given rows, in that order (beam search); this object stays as it was."""
        index = torch.tensor(rows, dtype=torch.long, device=self.member.device)  # may be empty
        chosen = Rows(self.member, self.prefix, derive_cache(self.cache, lambda t: t[index]), 0)
        chosen.tokens = [self.tokens[r] for r in rows]
        chosen.last = [self.last[r] for r in rows]
        chosen.width = self.width
        return chosen

    def fork(self, row: int, n: int) -> "Rows":
        """n new rows that continue row `row` (its real tokens, not its padding)."""
        end = len(self.prefix) + len(self.tokens[row])
        view = derive_cache(self.cache, lambda t: t[row : row + 1, :, :end].expand(n, -1, -1, -1))
        child = Rows(self.member, self.prefix + self.tokens[row], view, n)
        child.last = [self.last[row]] * n
        return child

    def truncate(self, row: int, length: int, last: torch.Tensor) -> None:
        """Row `row` keeps its first `length` tokens after the prefix; `last` is the distribution after them.

        The row has stopped early: it can be committed, not extended.
        """
        self.tokens[row] = self.tokens[row][:length]
        self.last[row] = last

    def cache_of_row(self, row: int) -> DynamicCache:
        end = len(self.prefix) + len(self.tokens[row])
        return derive_cache(self.cache, lambda t: t[row : row + 1, :, :end])


class Steps:
    """The log-probabilities one `Rows.extend` computed: `steps[i, j]` is the distribution after the j-th id
    row i read (j < the ids it read; a slice of j gives several, a slice of i stacks rows). The padding
    after a row's ids is never computed (adafuse/invariance.py `live_positions`): nothing to index there."""

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
