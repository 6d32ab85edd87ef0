"""A merged pass's attention in one variable-length call on a GPU (adafuse/backend/attention.py `SplitPass.one_call`).

Every row of every read is one sequence: its queries are its live positions in the packed row (already laid out
end to end, row after row: adafuse/backend/split_pass.py), its keys and values its read's cache up to its last
live position (its context's, then its own). The call computes each sequence on its own (causal, with the layer's
sliding window), so one launch replaces the per-request loop. A layer whose attention the call cannot compute
(logit soft-capping, attention sinks) runs per request, as without.

Our kernel reads each row's keys where they lie (`IN_PLACE`: each read's cache appends the pass's new positions,
and hands the runs its rows' positions lie in, adafuse/member/cache.py): no key or value is copied. Torch's own
call (`torch_varlen`, for the passes that need no exactness) takes them packed end to end (`packed_attention`):
the keys of all rows are copied into one tensor for the call, a layer at a time, and let go after it.
"""

import torch

from adafuse.backend.cuda import kernels
from adafuse.backend.live import on_device

EMPTY_RUN = [0] * kernels.RUN_FIELDS


def in_place_attention(module, query, split, kwargs):
    """The `one_call` of our kernel: every row at once, each row's keys and values read where they lie
    (`kernels.attention_in_place`). A row's runs are its buffers' rows as the cache hands them, their addresses
    and strides in elements; they stay alive and unwritten until the kernel has read them (the pass's own
    positions are written before it, and nothing writes a cache during a pass but the pass)."""
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        return None
    if split.one_call_layout is None:  # the same in every layer: each sequence's queries
        split.one_call_layout = sequences(split.spans, query.device)
    cu_q, _, max_q, _ = split.one_call_layout
    table = []
    kv_heads = split.pending[0][1].shape[1]
    for s, (own, new_keys, new_values) in zip(split.spans, split.pending, strict=True):
        own.append(new_keys, new_values)
        for row, live in enumerate(s.lengths):
            runs = [
                [k.data_ptr(), v.data_ptr(), n, k.stride(1), k.stride(0)] for k, v, n in own.runs(row, s.length + live)
            ]
            table.append(runs + [EMPTY_RUN] * (2 - len(runs)))
    split.pending = []
    q = query[0].transpose(0, 1)  # (positions, heads, d): the packed row's positions, row after row
    scale = kwargs.get("scaling") or module.scaling
    runs = on_device(torch.tensor(table, dtype=torch.int64), query.device)
    out = kernels.attention_in_place(q, runs, cu_q, kv_heads, scale, True, kwargs.get("sliding_window"), max_q)
    return out.unsqueeze(0), None


def packed_attention(attend):
    """The `one_call` for a split pass: `attend(q, k, v, cu_q, cu_k, scale, window, max_q, max_k)` over every row at
    once (the longest sequence's queries and keys known on the host: no sync to find them)."""

    def one_call(module, query, split, kwargs):
        if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
            return None
        if split.one_call_layout is None:  # the same in every layer: each sequence's queries and keys
            split.one_call_layout = sequences(split.spans, query.device)
        cu_q, cu_k, max_q, max_k = split.one_call_layout
        keys, values = [], []
        for s, (own, new_keys, new_values) in zip(split.spans, split.pending, strict=True):
            k, v = own.update(new_keys, new_values)  # (rows, kv_heads, length + width, d)
            for row, live in enumerate(s.lengths):
                keys.append(k[row, :, : s.length + live].transpose(0, 1))
                values.append(v[row, :, : s.length + live].transpose(0, 1))
        split.pending = []
        q = query[0].transpose(0, 1)  # (positions, heads, d): the packed row's positions, row after row
        scale = kwargs.get("scaling") or module.scaling
        out = attend(
            q, torch.cat(keys), torch.cat(values), cu_q, cu_k, scale, kwargs.get("sliding_window"), max_q, max_k
        )
        return out.unsqueeze(0), None

    return one_call


def sequences(spans, device) -> tuple:
    """A split pass's sequences, a row of a read each: (cu_q, cu_k) their cumulative query and key counts on
    `device` (int32), and the longest one's queries and keys. A row's queries are its live positions; its keys its
    read's cached positions and those."""
    cu_q, cu_k, max_q, max_k = [0], [0], 0, 0
    for s in spans:
        for live in s.lengths:
            end = s.length + live
            cu_q.append(cu_q[-1] + live)
            cu_k.append(cu_k[-1] + end)
            max_q, max_k = max(max_q, live), max(max_k, end)
    cu = [on_device(torch.tensor(c, dtype=torch.int32), device) for c in (cu_q, cu_k)]
    return *cu, max_q, max_k


IN_PLACE = in_place_attention


def torch_varlen():
    """Torch's own one-call attention over packed sequences (FlashAttention's variable-length kernel, CUDA only), in
    the shape `packed_attention` calls, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None

    def attend(q, k, v, cu_q, cu_k, scale, window, max_q, max_k):
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        left = -1 if window is None else window - 1
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=(left, 0))

    return attend
