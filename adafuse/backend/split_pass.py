"""The merged pass: one forward pass over the rows of several examples' requests to the same weights
(adafuse/engine/planner.py decides which requests meet; this module lays out and runs their pass).

Position ids are each row's own, so every row sees exactly its own context. Exact (the default), the
pass is one packed row of every request's real positions, and attention runs per request over the
request's own cache (a split pass, adafuse/backend/invariance.py); no merged cache is built and no padding is
computed. Not exact, inputs are right-padded and caches left-padded to the longest under one attention
mask: that merged cache is a buffer with room to grow (`ReservedLayer`) that a pass writes in place, and
a greedy step's merged cache may serve the next pass as it is (`Resident`).
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from adafuse.backend.invariance import (
    Span,
    live_index,
    live_positions,
    packed_logits,
    packed_positions,
    split_cache,
    split_pass,
)


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
    member,
    caches: list[DynamicCache],
    inputs: list[torch.Tensor],
    resident: Resident | None = None,
    may_stay: bool = False,
    exact: bool = True,
    real: list[list[int] | None] | None = None,
    last_only: list[bool] | None = None,
) -> tuple[list[torch.Tensor], Resident | None]:
    """One forward pass over the rows of several requests to the same weights: the logits of each, and
    the pass's cache where it may stay resident for the next pass (see `Resident`).

    Request j has a cache of length L_j (rows b_j) and inputs (b_j, n_j); the position ids are each row's
    own (L_j, L_j + 1, ...). Afterwards each request's cache holds its own rows and new tokens, as if it
    had been read alone.

    `exact`: every request's numbers are bitwise those of its pass alone (adafuse/backend/invariance.py). The
    pass is one packed row of every request's real positions (`_split_pass`); the linear layers multiply
    them all at once, in row tiles that make each row's bits independent of the others; attention runs per
    request over the request's own cache, which grows as alone (no merged cache is built); a model whose
    attention cannot be split is refused (adafuse/backend/__init__.py `Installed.splits_attention`). Otherwise inputs
    are right-padded to the widest, the caches are left-padded to the longest and stacked, an attention mask
    hides the padding (left padding shifts a row's keys and queries alike, so a sliding window keeps its true
    extent), and results equal the alone pass's up to rounding; `may_stay` (every request is a model's committed
    context) lets that merged cache serve the next pass.

    `real[j]`: request j's real ids per row (None: all of its width). Only those positions are computed
    (packed, or by the linear layers of a padded pass: adafuse/backend/invariance.py `live_positions`), and
    request j's logits are then packed, (sum(real[j]), vocab) (`Member.forward_alone`); a request without
    `real` gets (rows, width, vocab) as alone. `last_only[j]`: request j reads its ids for the distribution
    after them alone (a prompt's tail): the vocabulary projection makes only its last position's logits, and
    it gets (rows, 1, vocab), as `Member.forward_alone(..., last_only=True)` gives.
    """
    lengths = [c.get_seq_length() for c in caches]
    live = [n for j, x in enumerate(inputs) for n in (real[j] if real and real[j] else [x.shape[1]] * x.shape[0])]
    last_only = last_only or [False] * len(inputs)
    if any(one and real and real[j] for j, one in enumerate(last_only)):
        raise ValueError("a request reads either its real ids' logits or its last position's, not both")
    last = [one for x, one in zip(inputs, last_only) for _ in range(x.shape[0])]
    stays = None
    if exact:
        if not member.installed.splits_attention:
            raise ValueError(f"model {member.name!r}: its attention cannot be split per request; run its passes alone")
        logits = _split_pass(member, caches, inputs, lengths, live, last)
    else:
        logits, stays = _padded_pass(member, caches, inputs, lengths, live, last, resident, may_stay)
    results, at, row = [], 0, 0
    for j, x in enumerate(inputs):
        # request j's positions in the packed logits, (count, vocab) in row order
        count = x.shape[0] if last_only[j] else sum(live[row : row + x.shape[0]])
        own = logits[at : at + count]
        results.append(own if real and real[j] else own.view(x.shape[0], 1 if last_only[j] else x.shape[1], -1))
        at, row = at + count, row + x.shape[0]
    return results, stays


def _split_pass(member, caches, inputs, lengths, live, last) -> torch.Tensor:
    """The exact pass: one packed row of every request's live positions, request after request, row after row
    (no padding reaches a norm, an activation or a multiply), each attending per request as alone
    (adafuse/backend/invariance.py `split_pass`). Its logits, (positions read, vocab): every live position's, or a
    row's last alone where `last` asks."""
    device = member.device
    spans, ids, positions, read, row, start = [], [], [], [], 0, 0
    for x, length in zip(inputs, lengths):
        rows, width = x.shape
        own = live[row : row + rows]
        index = live_index(own, width, device) if any(n < width for n in own) else None
        flat_ids = x.flatten()
        flat_positions = torch.arange(length, length + width, device=device).repeat(rows)
        ids.append(flat_ids if index is None else flat_ids[index])
        positions.append(flat_positions if index is None else flat_positions[index])
        spans.append(Span(slice(row, row + rows), length, width, start, sum(own), index))
        for n, one in zip(own, last[row : row + rows]):
            read.extend(range(start + n - 1 if one else start, start + n))
            start += n
        row += rows
    head = torch.tensor(read, device=device) if any(last) else None
    longest = max(lengths)
    with packed_positions(start, head), split_pass(spans, longest):
        out = member.model(
            input_ids=torch.cat(ids)[None],
            position_ids=torch.cat(positions)[None],
            use_cache=True,
            **{member.cache_arg: split_cache(caches, spans, longest)},
        )
    logits = out.logits[0]
    if head is not None and logits.shape[0] == start:  # a head that could not be wrapped made every position's
        logits = logits.index_select(0, head)
    return logits.float()


def _padded_pass(member, caches, inputs, lengths, live, last, resident, may_stay):
    """The pass not exact: inputs right-padded to the widest, each row at its own positions, over the caches
    left-padded and stacked under one merged mask. Its logits as `_split_pass` gives them, and the merged
    cache where it may stay resident."""
    longest, width = max(lengths), max(x.shape[1] for x in inputs)
    device = member.device
    ids = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=int(x[0, -1])) for x in inputs])
    positions = torch.cat(
        [torch.arange(n, n + width, device=device).expand(x.shape[0], -1) for n, x in zip(lengths, inputs)]
    )
    spans, row = [], 0
    for length, x in zip(lengths, inputs):
        spans.append(Span(slice(row, row + x.shape[0]), length, x.shape[1]))
        row += x.shape[0]
    mask = torch.zeros(row, longest + width, dtype=torch.long, device=device)
    for s in spans:
        mask[s.rows, longest - s.length : longest + s.width] = 1
    merged = resident.merged if resident is not None and resident.holds(caches) else _merge(caches, longest, width)
    with live_positions(live, width, device, last):
        out = member.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True, **{member.cache_arg: merged}
        )
    stays = may_stay and all(s.width == width and s.batch == 1 for s in spans)
    for cache, s in zip(caches, spans):
        span = slice(longest - s.length, longest + s.width)
        for own, new in zip(cache.layers, merged.layers):
            own.keys, own.values = new.keys[s.rows, :, span], new.values[s.rows, :, span]
            if not stays:
                # Copies: a view would keep the whole padded merged cache alive for as long as any one
                # request keeps its cache (a scored candidate waits for the commit), and on GSM8K with
                # 8 examples in flight those merged caches reached 11 GB.
                own.keys, own.values = own.keys.clone(), own.values.clone()
    resident = Resident(list(caches), merged, [c.layers[0].keys for c in caches]) if stays else None
    return packed_logits(out.logits, live, width, last).float(), resident


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
