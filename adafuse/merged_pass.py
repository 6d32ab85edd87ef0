"""The merged pass: one forward pass over the rows of several examples' requests to the same weights
(adafuse/batching.py decides which requests meet; this module lays out and runs their pass).

Caches are left-padded to the longest and inputs right-padded; an attention mask hides the padding
and position ids are each row's own, so every row sees exactly its own context. The merged cache is
a buffer with room to grow (`ReservedLayer`) that a pass writes in place, and a greedy step's merged
cache may serve the next pass as it is (`Resident`).
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from adafuse.invariance import Span, split_attention, split_pass
from adafuse.model import Member


class ReservedLayer(DynamicLayer):
    """A merged pass's cache layer: a buffer with room to grow, into which new tokens are written in place.

    `DynamicLayer.update` concatenates, which copies the whole layer at every pass; this writes only
    the new positions. `keys` and `values` are views of the filled positions. Positions before a
    row's own context must be zeros (left padding, written by `_merge`): masked keys get no weight,
    and zero values keep 0 * value finite. The room after the filled positions is never read before
    a pass writes it, so it is left unset (zeroing it cost as much as the copies).
    """

    def __init__(self, like: torch.Tensor, rows: int, room: int):
        super().__init__()
        self.lazy_initialization(like, like)
        shape = (rows, like.shape[1], room, like.shape[3])
        self.key_buffer, self.value_buffer = like.new_empty(shape), like.new_empty(shape)
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[2]
        if end > self.key_buffer.shape[2]:
            more = (0, 0, 0, end + max(64, end // 4) - self.length)
            self.key_buffer = torch.nn.functional.pad(self.key_buffer[:, :, : self.length], more)
            self.value_buffer = torch.nn.functional.pad(self.value_buffer[:, :, : self.length], more)
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.fill(end)
        return self.keys, self.values

    def fill(self, length: int) -> None:
        self.length = length
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]


@dataclass
class Resident:
    """The padded cache of a merged pass that may serve the next pass as it is.

    Kept when every request was one model's committed context, one row, and read as many tokens as
    the others (a greedy step of each example in flight): each request's cache is then a view of its
    row, and the next pass over exactly these caches, unmoved, finds them laid out as a fresh merge
    would lay them out. Forks are never kept this way: their rows wait for a commit, and a view
    would keep the whole buffer, every example's rows, alive for as long as the longest wait.
    """

    caches: list[DynamicCache]
    merged: DynamicCache
    views: list[torch.Tensor]  # each cache's first-layer keys as handed back

    def holds(self, caches: list[DynamicCache]) -> bool:
        return len(caches) == len(self.caches) and all(
            c is mine and c.layers[0].keys is view for c, mine, view in zip(caches, self.caches, self.views)
        )


@torch.inference_mode()
def forward_together(
    member: Member,
    caches: list[DynamicCache],
    inputs: list[torch.Tensor],
    resident: Resident | None = None,
    may_stay: bool = False,
    exact: bool = True,
) -> tuple[list[torch.Tensor], Resident | None]:
    """One forward pass over the rows of several requests to the same weights: the logits of each, and
    the pass's cache where it may stay resident for the next pass (`may_stay`: every request is a
    model's committed context; see `Resident`).

    Request j has a cache of length L_j (rows b_j) and inputs (b_j, n_j). Caches are left-padded to
    the longest, inputs right-padded; the attention mask hides the padding and the position ids are
    each row's own (L_j, L_j + 1, ...), so every row sees exactly its own context. Left padding shifts
    a row's keys and queries alike, so a sliding window (Gemma 3) keeps its true extent. Afterwards
    each request's cache holds its own rows and new tokens, as if it had been read alone.

    `exact`: every request's numbers are bitwise those of its pass alone (adafuse/invariance.py:
    attention per request; the linear layers multiply all rows at once, in row tiles that make each
    row's bits independent of the others, alone and merged alike); a model whose attention cannot be
    split is refused (`can_merge_exactly`).
    Otherwise the merged mask stands for the padding, and results equal the alone pass's up to
    rounding.
    """
    lengths = [c.get_seq_length() for c in caches]
    longest, width = max(lengths), max(x.shape[1] for x in inputs)
    device = member.device
    ids = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=int(x[0, -1])) for x in inputs])
    mask = torch.zeros(ids.shape[0], longest + width, dtype=torch.long, device=device)
    positions = torch.empty(ids.shape[0], width, dtype=torch.long, device=device)
    row = 0
    for length, x in zip(lengths, inputs):
        mask[row : row + x.shape[0], longest - length : longest + x.shape[1]] = 1
        positions[row : row + x.shape[0]] = torch.arange(length, length + width, device=device)
        row += x.shape[0]

    merged = resident.merged if resident is not None and resident.holds(caches) else _merge(caches, longest, width)
    kwargs = {"input_ids": ids, "position_ids": positions, "use_cache": True, member.cache_arg: merged}
    if exact:
        if not can_merge_exactly(member.model):  # idempotent: it prepares a model on its first merged pass
            raise ValueError(f"model {member.name!r}: its attention cannot be split per request; run its passes alone")
        spans, row = [], 0
        for length, x in zip(lengths, inputs):
            spans.append(Span(slice(row, row + x.shape[0]), length, x.shape[1]))
            row += x.shape[0]
        with split_pass(spans, longest):
            out = member.model(**kwargs)  # each request's own masks replace the merged one
    else:
        out = member.model(attention_mask=mask, **kwargs)
    stays = may_stay and all(x.shape == (1, width) for x in inputs)
    logits, results, row = out.logits.float(), [], 0
    for cache, length, x in zip(caches, lengths, inputs):
        rows, span = slice(row, row + x.shape[0]), slice(longest - length, longest + x.shape[1])
        for own, new in zip(cache.layers, merged.layers):
            own.keys, own.values = new.keys[rows, :, span], new.values[rows, :, span]
            if not stays:
                # Copies: a view would keep the whole padded merged cache alive for as long as any one
                # request keeps its cache (a scored candidate waits for the commit), and on GSM8K with
                # 8 examples in flight those merged caches reached 11 GB.
                own.keys, own.values = own.keys.clone(), own.values.clone()
        results.append(logits[rows, : x.shape[1]])
        row += x.shape[0]
    return results, Resident(list(caches), merged, [c.layers[0].keys for c in caches]) if stays else None


def can_merge_exactly(model) -> bool:
    """Prepare a model for exact merged passes (adafuse/invariance.py); False if it cannot be. Its linear
    layers need nothing: every member's multiply in row tiles in every pass (`tile_linear_layers`)."""
    return split_attention(model)


def _merge(caches: list[DynamicCache], longest: int, width: int) -> DynamicCache:
    """The caches left-padded to `longest` and stacked, with room for this pass and some steps after it."""
    merged = DynamicCache()
    for layer in range(len(caches[0].layers)):
        own = [c.layers[layer] for c in caches]
        rows = sum(o.keys.shape[0] for o in own)
        stacked = ReservedLayer(own[0].keys, rows, longest + width + 64)
        row = 0
        for o in own:
            n, length = o.keys.shape[0], o.keys.shape[2]
            for buffer, own_tensor in ((stacked.key_buffer, o.keys), (stacked.value_buffer, o.values)):
                buffer[row : row + n, :, : longest - length] = 0
                buffer[row : row + n, :, longest - length : longest] = own_tensor
            row += n
        stacked.fill(longest)
        merged.layers.append(stacked)
    return merged
