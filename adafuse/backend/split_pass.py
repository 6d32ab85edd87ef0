"""The merged pass: the reads of several requests to the same weights in one forward pass, each computed
exactly as in its pass alone (adafuse/engine/scheduler.py decides which requests meet).

The pass is one packed row of every read's real positions, request after request, row after row: no padding
reaches a norm, an activation or a multiply, and position ids are each row's own, so every row sees exactly
its own context. Linear layers multiply the whole packed row at once (in row tiles, where the pass is exact:
adafuse/backend/cpu/tiles.py); attention runs per request over the request's own cache, which grows as alone
(adafuse/backend/attention.py); the vocabulary projection makes logits only where a read asks for them
(adafuse/backend/live.py). No merged cache is built.
"""

from dataclasses import replace

import torch

from adafuse.backend.attention import Span, SplitPass, split_cache
from adafuse.backend.forward import ForwardContext, forward_context
from adafuse.backend.interface import Prepared, Read
from adafuse.backend.live import live_index, on_device, packed_row


@torch.inference_mode()
def merged_pass(model: Prepared, reads: list[Read], context: ForwardContext, one_call=None) -> list[torch.Tensor]:
    """Each read's float32 logits, shaped as its pass alone gives them (`Read`), from one packed pass.

    Read j has a cache of length L_j and ids (b_j, n_j); its positions are L_j, L_j + 1, ... in every row.
    Afterwards each read's cache holds its own rows and new positions, as if it had been read alone. `one_call`:
    the backend's attention over every read at once (adafuse/backend/attention.py `SplitPass`), else per read."""
    if any(r.last_only and r.lengths for r in reads):
        raise ValueError("a read reads either its real ids' logits or its last position's, not both")
    device = model.device
    spans, ids, positions, head, row, start = [], [], [], [], 0, 0
    lengths = [r.cache.get_seq_length() for r in reads]
    for r, length in zip(reads, lengths):
        rows, width = r.input_ids.shape
        own = r.lengths or [width] * rows
        index = live_index(own, width, device) if any(n < width for n in own) else None
        flat_ids = on_device(r.input_ids, device).flatten()
        flat_positions = torch.arange(length, length + width, device=device).repeat(rows)
        ids.append(flat_ids if index is None else flat_ids[index])
        positions.append(flat_positions if index is None else flat_positions[index])
        spans.append(Span(slice(row, row + rows), length, width, start, sum(own), index, tuple(own)))
        for n in own:
            head.extend(range(start + n - 1 if r.last_only else start, start + n))
            start += n
        row += rows
    logits_at = on_device(head, device) if any(r.last_only for r in reads) else None
    split = SplitPass(spans, max(lengths), one_call=one_call)
    with forward_context(replace(context, live=packed_row(start, logits_at), split=split)):
        out = model.model(
            input_ids=torch.cat(ids)[None],
            position_ids=torch.cat(positions)[None],
            use_cache=True,
            **{model.cache_arg: split_cache([r.cache for r in reads], split)},
        )
    logits = out.logits[0]
    if logits_at is not None and logits.shape[0] == start:  # a head the backend could not wrap made every position's
        logits = logits.index_select(0, logits_at)
    logits = logits.float()
    results, at = [], 0
    for r, s in zip(reads, spans):
        count = s.batch if r.last_only else s.count
        own = logits[at : at + count]
        results.append(own if r.lengths else own.view(s.batch, 1 if r.last_only else s.width, -1))
        at += count
    return results
