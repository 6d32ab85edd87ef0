"""The KV cache under a member's context (adafuse/member/context.py): a context's own positions, forks that
read them in place, and the prompt prefixes a model's examples share (`PromptStore`).

A context owns one buffer per layer (`KVBuffer`, rows x heads x capacity x head_dim) and holds the first
`length` positions of it (`ContextLayer`). A pass appends after them: in place when the context's end is the
buffer's end (its `filled` positions), or when every cache layer that read past it has been let go (`open_at`:
each buffer knows its readers, weakly; a proposal that lost its round, a context cut back), else into a new buffer
of the context's own. So a position any live view covers is never written.

A prompt read after a stored prefix (a task's instruction and exemplars, `PromptStore`) writes into a buffer of its
own whose first positions it leaves unwritten: they are read where the store holds them (the buffer's `under`), and
copied in only when a pass needs the context's positions as one tensor (`written_out`, the CPU's attention).

A fork (`ForkLayer`: branch rows, candidates to score, a beam) continues a context's first `upto` positions with
positions of its own, in a small buffer of its own: it reads the context's positions in place and never copies
them. A fork of one row at the end of its context's buffer (a proposal's words) writes its positions there, after
the context's, in place: a pass reads them as they are, and committing it copies nothing. Attention needs each
row's positions as one tensor: a fork layer of several rows makes it when a pass asks for it (the shared positions
expanded over the rows, then the row's own) and lets it go after that layer's attention, so one fork layer's whole
view exists at a time, not one per row per layer for the length of a round. The attention's inputs are the same
values either way, and so are its bits (docs/speed.md, "Memory").

Committing a fork's row (`commit_row`) appends that row's own positions to the context it forked, when the context
is next read (`ContextLayer.pending`: by then the round's other forks are let go, so it goes in place): a round
copies only the winner's new positions, and none where the winner rode the context's buffer.

All layers are full-length, also for sliding-window models (Gemma 3): the model applies its window through the
attention mask, and a full layer can be cut back anywhere, which a rejected word needs (transformers' sliding
layers refuse once the window is full).

A backend that reads positions where they lie (the CUDA backend's attention, adafuse/backend/cuda/attention.py) asks
each layer, once per pass, to `claim` room for the pass's new positions (the buffer and the place its kernel writes
them to), and where each row's positions lie: the buffers a layer reads (`sources`: the context's, a fork's own,
the stored prefix under the context's) and each row's runs in them (`run_plan`: which source, which of its rows,
from which position, how many), a plan the same in every layer of a cache, since every layer is written alike; each
buffer's `layout` turns a run into addresses. Nothing is made into one tensor, and nothing is copied.

Every buffer is charged to its model's `KVLedger` while it lives: the bytes of KV a model's contexts and forks
hold now and at most, apart from the stored prefixes they share (adafuse/engine/executor.py reports them per
example in flight).
"""

import weakref

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class KVLedger:
    """The bytes of KV one model's buffers hold: the examples' contexts and forks (`held`, and the most they ever
    held at once, `peak`, growing buffers' copies included) and the stored prompt prefixes they share
    (`prefixes`)."""

    def __init__(self):
        self.held = 0
        self.peak = 0
        self.prefixes = 0

    def charge(self, buffer: "KVBuffer") -> None:
        size = buffer.keys.nbytes + buffer.values.nbytes
        if buffer.frozen:
            self.prefixes += size
            weakref.finalize(buffer, self._release_prefix, size)
            return
        self.held += size
        self.peak = max(self.peak, self.held)
        weakref.finalize(buffer, self._release, size)

    def _release(self, size: int) -> None:
        self.held -= size

    def _release_prefix(self, size: int) -> None:
        self.prefixes -= size

    def reset_peak(self) -> None:
        """Count the peak from what is held now (a new run over the same model)."""
        self.peak = self.held


class KVBuffer:
    """One layer's keys and values for some rows, (rows, heads, capacity, head_dim), of which the first `filled`
    positions are written. `frozen`: never written in place (a stored prompt prefix, which every example reads)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int, ledger: KVLedger, frozen: bool = False):
        self.keys, self.values, self.filled, self.ledger, self.frozen = keys, values, filled, ledger, frozen
        self.readers = weakref.WeakSet()  # the cache layers that read its positions (`open_at`)
        self.under: tuple[KVBuffer, int] | None = None  # (a stored prefix, n): its first n positions lie there
        self.under_copied = False  # those positions copied here too (`written_out`); runs still read them there
        ledger.charge(self)
        strides = keys.stride()  # read once: a buffer's tensors never change
        self._layout = (keys.data_ptr(), values.data_ptr(), strides[0], strides[2], strides[1], keys.element_size())
        self._same_strides = values.stride() == strides

    def layout(self) -> tuple[int, int, int, int, int, int]:
        """Where its rows lie, for a reader of addresses: its first key's and value's addresses, the strides between
        rows, positions and heads in elements, and an element's bytes (keys' and values' places by one stride)."""
        if not self._same_strides:
            raise ValueError(f"keys strided {self.keys.stride()} and values {self.values.stride()} in one buffer")
        return self._layout

    @classmethod
    def empty(cls, like: "KVBuffer", rows: int, capacity: int) -> "KVBuffer":
        return cls.shaped(like.keys, like.values, rows, capacity, like.ledger)

    @classmethod
    @torch.inference_mode()
    def shaped(cls, keys, values, rows: int, capacity: int, ledger: KVLedger) -> "KVBuffer":
        """An empty buffer of `rows` rows and `capacity` positions for keys and values shaped as `keys` and `values`
        (rows, heads, positions, head_dim)."""
        k = keys.new_empty((rows, keys.shape[1], capacity, keys.shape[3]))
        v = values.new_empty((rows, values.shape[1], capacity, values.shape[3]))
        return cls(k, v, 0, ledger)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def open_at(self, at: int) -> bool:
        """Whether positions from `at` on may be written without changing what any cache layer alive reads: `at`
        is where its written positions end, or every layer that read past `at` has been let go (a proposal that
        lost its round, a context cut back), so that its positions there are free again."""
        if self.under is not None and at < self.under[1]:  # those positions are the stored prefix's
            return False
        return self.filled == at or (
            not self.frozen and self.filled > at and all(layer.extent(self) <= at for layer in self.readers)
        )

    def written_out(self) -> "KVBuffer":
        """This buffer with every position it holds written in it: the first ones, read where a stored prefix holds
        them (`under`), copied here, once, for a reader that makes its positions one tensor. Runs go on reading them
        in the prefix (the same values): every layer of a cache plans its runs alike, written out or not."""
        if self.under is not None and not self.under_copied:
            prefix, count = self.under
            self.write(0, prefix.keys[:, :, :count], prefix.values[:, :, :count])
            self.under_copied = True
        return self

    @torch.inference_mode()  # a pass's keys are inference tensors; a commit or a fork writes them outside one
    def write(self, at: int, keys: torch.Tensor, values: torch.Tensor, rows=slice(None)) -> None:
        end = at + keys.shape[2]
        self.keys[rows, :, at:end] = keys
        self.values[rows, :, at:end] = values
        self.filled = max(self.filled, end)


def _claim(
    buffer: KVBuffer | None, length: int, new: int, room: int, ledger: KVLedger, keys=None, values=None
) -> KVBuffer:
    """Room for `new` positions after the first `length` of `buffer`, marked written (the caller writes them before
    anything reads them): the buffer itself where `length` is its end and it has room (`open_at`), else a new one
    with `room` more after the new ones, which holds the first `length`: read where they lie if they are a stored
    prefix's (the new buffer's `under`), else copied (a context that holds nothing yet gets its first buffer so,
    shaped as `keys` and `values`). The buffer that takes them, at `length`."""
    end = length + new
    if buffer is None:
        buffer = KVBuffer.shaped(keys, values, keys.shape[0], end + room, ledger)
    elif buffer.frozen or end > buffer.capacity or not buffer.open_at(length):
        grown = KVBuffer.empty(buffer, buffer.keys.shape[0], end + room)
        under = (buffer, length) if buffer.frozen else buffer.under
        kept = 0 if under is None else min(under[1], length)
        if kept:
            grown.under = (under[0], kept)
        if length > kept:
            grown.write(kept, buffer.keys[:, :, kept:length], buffer.values[:, :, kept:length])
        buffer = grown
    buffer.filled = end  # what lay past `end` in an open buffer is read by no one
    return buffer


class ViewLayer(DynamicLayer):
    """A cache layer whose keys and values are made from the buffers it holds when they are read (`whole`), never
    kept nor set: a pass that reads them where they lie (`run_plan`) makes none."""

    def whole(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        raise NotImplementedError

    @property
    def keys(self) -> torch.Tensor | None:
        return self.whole()[0]

    @keys.setter
    def keys(self, value) -> None:
        if value is not None:  # the mixin's __init__ sets None; nothing else may set them
            raise AttributeError(f"a {type(self).__name__}'s keys are made from its buffers: they cannot be set")

    @property
    def values(self) -> torch.Tensor | None:
        return self.whole()[1]

    @values.setter
    def values(self, value) -> None:
        if value is not None:
            raise AttributeError(f"a {type(self).__name__}'s values are made from its buffers: they cannot be set")


class ContextLayer(ViewLayer):
    """One layer of a context: the first `length` positions of a buffer; `keys` and `values` are their views. A
    context read from nothing (`fresh_cache`) has no buffer until its first read, which makes one with `room`
    positions to spare after what it reads (a prompt's: the positions its method may add to it), so that the
    context then grows in place.

    A context committed from a fork's row whose own positions lie in the fork's buffer holds them there
    (`pending`) until it is next read or written: they are then written after its first `length` positions, in
    place if the forks that wrote past those have been let go by then (the round that made them has ended;
    at the commit itself they are still held)."""

    ROOM = 64  # positions of room a new buffer gets after what it must hold, at the least

    def __init__(
        self, buffer: KVBuffer | None, length: int, room: int = 0, ledger: KVLedger | None = None, pending=None
    ):
        super().__init__()
        self.is_initialized = True
        self.room, self.ledger = max(room, self.ROOM), ledger if buffer is None else buffer.ledger
        if buffer is not None:
            self.device, self.dtype = buffer.keys.device, buffer.keys.dtype
        self.buffer, self.length = buffer, length
        self.pending: tuple[KVBuffer, int, int] | None = pending  # (a fork's own buffer, its row, positions)

    @property
    def buffer(self) -> KVBuffer | None:
        return self._buffer

    @buffer.setter
    def buffer(self, buffer: KVBuffer | None) -> None:
        self._buffer = buffer
        if buffer is not None:
            buffer.readers.add(self)

    def extent(self, buffer: KVBuffer) -> int:
        """The positions of `buffer` it reads (`KVBuffer.open_at`)."""
        return self.length if buffer is self._buffer else 0

    def settled(self) -> "ContextLayer":
        """This layer with every position it holds in its buffer (`pending` written there)."""
        if self.pending is not None:
            source, row, count = self.pending
            self.pending = None
            buffer, at = self.claim(count)
            buffer.write(at, source.keys[row : row + 1, :, :count], source.values[row : row + 1, :, :count])
        return self

    def whole(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Its positions' keys and values, views of its buffer (None before it has one)."""
        self.settled()
        if self.buffer is None:
            return None, None
        buffer = self.buffer.written_out()
        return buffer.keys[:, :, : self.length], buffer.values[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length + (self.pending[2] if self.pending is not None else 0)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.append(key_states, value_states)
        return self.whole()

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write the pass's new positions, (rows, heads, new, head_dim), after the context's."""
        if self.buffer is None:
            self.device, self.dtype = key_states.device, key_states.dtype
        buffer, at = self.claim(key_states.shape[2], key_states, value_states)
        buffer.write(at, key_states, value_states)

    def claim(self, new: int, keys=None, values=None) -> tuple[KVBuffer, int]:
        """Room for a pass's `new` positions after the context's, held as written: the buffer they go in and where
        (its rows are the context's). Whoever claims writes them there before anything reads them. `keys` and
        `values` shape a context's first buffer."""
        if self.pending is not None:
            self.settled()
        at = self.length
        buffer = _claim(self._buffer, at, new, self.room, self.ledger, keys, values)
        if buffer is not self._buffer:  # a new buffer: it learns its reader
            self.buffer = buffer
        self.length = at + new
        return buffer, at

    def sources(self) -> tuple[KVBuffer, ...]:
        """The buffers its positions lie in (`run_plan` names them by index): its own, and the stored prefix under
        it, if any."""
        return _with_under((self.settled().buffer,), self.buffer)

    def run_plan(self, row: int, length: int) -> list[tuple[int, int, int, int]]:
        """Where row `row`'s first `length` positions lie, as (source, the source's row, first position, count)
        runs: its buffer's (after a stored prefix's, if they lie over one)."""
        return _buffer_runs(self.buffer, 0, row, length, under_source=1)

    def crop(self, tokens_to_remove: int) -> None:
        """Keep all but the last `-tokens_to_remove` positions (transformers' convention); the next write goes
        after them, in place if nothing alive reads the buffer past them, else in a buffer of the context's own."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, not {tokens_to_remove}")
        self.length = max(0, self.settled().length + tokens_to_remove)


class ForkLayer(ViewLayer):
    """One layer of `rows` rows that continue the first `upto` positions of a context's buffer (read in place,
    never copied), each with `own_length` positions of its own after them. A pass gets every row's whole keys and
    values (`whole`); `keys` and `values` give them too, when read.

    Its own positions live in a small buffer of its own (`own`), made into one tensor with the context's for a
    pass. One row at the end of the context's buffer (a proposal's words) writes them there instead, after the
    context's, in place (`riding`): a pass reads the buffer as it is, and committing the row copies nothing. Where
    it cannot go on so (another fork wrote there first, or the buffer is full), it moves its few positions to a
    buffer of its own and goes on there."""

    ROOM = 16  # a fork grows a few tokens at a time, in every one of its rows

    def __init__(
        self, base: KVBuffer, upto: int, rows: int, own: KVBuffer | None = None, own_length: int = 0, room: int = 0
    ):
        super().__init__()
        self.is_initialized = True
        self.device, self.dtype = base.keys.device, base.keys.dtype
        self.base, self.upto, self.rows, self.own, self.own_length = base, upto, rows, own, own_length
        base.readers.add(self)
        self.room = room  # its context's: what a context committed from it keeps to spare (`ContextLayer`)
        self.riding = False  # its own positions are the base buffer's, from `upto` on

    @property
    def own(self) -> KVBuffer | None:
        return self._own

    @own.setter
    def own(self, own: KVBuffer | None) -> None:
        self._own = own
        if own is not None:
            own.readers.add(self)

    def extent(self, buffer: KVBuffer) -> int:
        """The positions of `buffer` it reads (`KVBuffer.open_at`)."""
        if buffer is self.base:
            return self.upto + self.own_length if self.riding else self.upto
        return self.own_length if buffer is self._own else 0

    def get_seq_length(self) -> int:
        return self.upto + self.own_length

    def whole(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's keys and values, (rows, heads, upto + own_length, head_dim): a view of the base buffer where
        the fork rides it, else a new tensor each."""
        end = self.upto + self.own_length
        base = self.base.written_out()
        if self.riding:
            return base.keys[:, :, :end], base.values[:, :, :end]
        keys = base.keys[:1, :, : self.upto].expand(self.rows, -1, -1, -1)
        values = base.values[:1, :, : self.upto].expand(self.rows, -1, -1, -1)
        if not self.own_length:
            return keys, values
        own = self.own
        keys = torch.cat([keys, own.keys[:, :, : self.own_length]], dim=2)
        return keys, torch.cat([values, own.values[:, :, : self.own_length]], dim=2)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.append(key_states, value_states)
        return self.whole()

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write the pass's new positions, (rows, heads, new, head_dim), after each row's (`update` without making
        every row's whole keys and values: a reader of `run_plan` reads them where they lie)."""
        buffer, at = self.claim(key_states.shape[2])
        buffer.write(at, key_states, value_states)

    def claim(self, new: int) -> tuple[KVBuffer, int]:
        """Room for a pass's `new` positions after each row's, held as written: the buffer they go in (its rows are
        the fork's) and where. Whoever claims writes them there before anything reads them."""
        end = self.upto + self.own_length
        base = self.base
        # one row that rides, or may start to, on a buffer open at its end (asked last: it may look at every reader)
        if (
            self.rows == 1
            and (self.riding or not self.own_length)
            and not base.frozen
            and end + new <= base.capacity
            and base.open_at(end)
        ):
            base.filled = end + new
            self.riding = True
            buffer, at = base, end
        else:
            if self.riding:  # its positions move to a buffer of its own
                self.own = KVBuffer.empty(self.base, 1, self.own_length + new + self.ROOM)
                riding = slice(self.upto, end)
                self.own.write(0, self.base.keys[:, :, riding], self.base.values[:, :, riding])
                self.riding = False
            elif self.own is None:
                self.own = KVBuffer.empty(self.base, self.rows, new + self.ROOM)
            self.own = _claim(self.own, self.own_length, new, self.ROOM, self.own.ledger)
            buffer, at = self.own, self.own_length
        self.own_length += new
        return buffer, at

    def sources(self) -> tuple[KVBuffer, ...]:
        """The buffers its positions lie in (`run_plan` names them by index): the context's, its own, and the stored
        prefix under the context's, if any."""
        return _with_under((self.base,) if self.own is None else (self.base, self.own), self.base)

    def run_plan(self, row: int, length: int) -> list[tuple[int, int, int, int]]:
        """Where row `row`'s first `length` positions lie, as (source, the source's row, first position, count)
        runs: the context's first (after a stored prefix's, if they lie over one), the row's own after them (where
        it rides the context's buffer, there)."""
        in_base = length if self.riding else min(length, self.upto)
        runs = _buffer_runs(self.base, 0, 0, in_base, under_source=1 if self.own is None else 2)
        if in_base < length:
            runs.append((1, row, 0, length - self.upto))
        return runs

    def of_rows(self, rows: list[int]) -> "ForkLayer":
        """A fork of the given rows, in that order, over the same context positions (their own copied; where it
        rides the base buffer, they are the buffer's: read in place)."""
        if self.riding:
            return ForkLayer(self.base, self.upto + self.own_length, len(rows), room=self.room)
        if self.own is None or not self.own_length:
            return ForkLayer(self.base, self.upto, len(rows), room=self.room)
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        own = KVBuffer.empty(self.own, len(rows), self.own_length + self.ROOM)
        own.write(0, self.own.keys[index, :, : self.own_length], self.own.values[index, :, : self.own_length])
        return ForkLayer(self.base, self.upto, len(rows), own, self.own_length, self.room)

    def continued(self, row: int, end: int, rows: int) -> "ForkLayer":
        """`rows` rows that each continue row `row` up to position `end` (its real tokens)."""
        length = end - self.upto
        if self.riding or not length:
            return ForkLayer(self.base, end, rows, room=self.room)
        own = KVBuffer.empty(self.own, rows, length + self.ROOM)
        keys, values = self.own.keys[row : row + 1, :, :length], self.own.values[row : row + 1, :, :length]
        own.write(0, keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1))
        return ForkLayer(self.base, self.upto, rows, own, length, self.room)

    def committed(self, row: int, end: int) -> ContextLayer:
        """The context that row `row` makes up to position `end`: the forked context's first `upto` positions
        and the row's own after them, which it writes after those when next read (`ContextLayer.pending`: by then
        this fork and the others of its round are let go, and they go in place); where the fork rides the buffer,
        they are there already."""
        if self.riding:
            return ContextLayer(self.base, end, self.room)
        length = end - self.upto
        return ContextLayer(self.base, self.upto, self.room, pending=(self.own, row, length) if length else None)


def _with_under(sources: tuple[KVBuffer, ...], buffer: KVBuffer) -> tuple[KVBuffer, ...]:
    return sources if buffer.under is None else (*sources, buffer.under[0])


def _buffer_runs(buffer: KVBuffer, source: int, row: int, length: int, under_source: int) -> list:
    """Row `row` of `buffer`'s (source `source`) first `length` positions as runs: those that lie in the stored
    prefix under it (source `under_source`, its only row), then its own."""
    kept = 0 if buffer.under is None else min(buffer.under[1], length)
    runs = [(under_source, 0, 0, kept)] if kept else []
    if length > kept or not runs:
        runs.append((source, row, kept, length - kept))
    return runs


def context_cache(cache: DynamicCache, ledger: KVLedger, frozen: bool = False) -> DynamicCache:
    """A cache the model filled from nothing (transformers' own layers), as a context's: each layer's tensors
    become its buffer, charged to `ledger` (no copy). `frozen`: never written in place (a stored prefix)."""
    layers = []
    for layer in cache.layers:
        buffer = KVBuffer(layer.keys, layer.values, layer.keys.shape[2], ledger, frozen)
        layers.append(ContextLayer(buffer, buffer.filled))
    return _cache(layers)


def view_cache(cache: DynamicCache, length: int | None = None, room: int = 0) -> DynamicCache:
    """A cache of its own over the same buffers: a context's first `length` positions (default: all of them),
    or a fork's rows as they are. Writing after them copies, unless they end where their buffer does (a context's
    copy then gets `room` positions to spare)."""
    layers = []
    for layer in cache.layers:
        if isinstance(layer, ForkLayer):
            if length is not None:
                raise ValueError("a fork is viewed whole")
            layers.append(ForkLayer(layer.base, layer.upto, layer.rows, layer.own, layer.own_length, layer.room))
        else:
            layer = layer.settled()
            layers.append(ContextLayer(layer.buffer, layer.length if length is None else length, room))
    return _cache(layers)


def fresh_cache(layers: int, ledger: KVLedger, room: int) -> DynamicCache:
    """A context of `layers` layers that holds nothing yet: its first read makes its buffers, with `room` positions
    to spare after what it reads, charged to `ledger`."""
    return _cache([ContextLayer(None, 0, room, ledger) for _ in range(layers)])


def fork_cache(cache: DynamicCache, rows: int, upto: int) -> DynamicCache:
    """`rows` rows that continue a context's first `upto` positions, which they read in place."""
    return _cache([ForkLayer(layer.settled().buffer, upto, rows, room=layer.room) for layer in cache.layers])


def select_rows(fork: DynamicCache, rows: list[int]) -> DynamicCache:
    return _cache([layer.of_rows(rows) for layer in fork.layers])


def continue_row(fork: DynamicCache, row: int, end: int, rows: int) -> DynamicCache:
    """`rows` rows that continue a fork's row up to position `end` (`continued`)."""
    return _cache([layer.continued(row, end, rows) for layer in fork.layers])


def commit_row(fork: DynamicCache, row: int, end: int) -> DynamicCache:
    """The context that a fork's row makes up to position `end` (`committed`)."""
    return _cache([layer.committed(row, end) for layer in fork.layers])


def _cache(layers: list) -> DynamicCache:
    cache = DynamicCache()
    cache.layers.extend(layers)
    return cache


class PromptStore:
    """The KV of the shared prompt prefixes (a task's instruction and exemplars) that a model's examples read, one
    store per model (adafuse/member/runner.py): a prefix is read once, not once per example or slot. Four, the
    last used kept: examples of two or three tasks in flight at once (a mixed queue, as the benchmark's) each
    keep their task's prefix. A stored cache is frozen: its readers write after it in buffers of their own, and read
    it where it lies (`KVBuffer.under`) until a pass needs their positions as one tensor."""

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
