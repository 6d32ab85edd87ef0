"""KV-cache mechanics under a member's context (adafuse/member/context.py): caches derived as views that grow in
place, and the shared prompt prefixes a member's clones read once (`PromptStore`).
"""

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


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
