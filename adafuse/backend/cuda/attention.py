"""A merged pass's attention in one variable-length call on a GPU (adafuse/backend/attention.py `SplitPass.one_call`).

Every row of every read is one sequence: its queries are its live positions in the packed row (already laid out
end to end, row after row: adafuse/backend/split_pass.py), its keys and values its read's cache up to its last
live position (its context's, then its own). The call computes each sequence on its own (causal, with the layer's
sliding window), so one launch replaces the per-request loop. A layer whose attention the call cannot compute
(logit soft-capping, attention sinks) runs per request, as without.

Our kernel reads each row's keys where they lie (`IN_PLACE`), and the host's work for it is done once per pass, not
per layer (`InPlace`): at the first layer each read's cache claims, in every layer, room for the pass's new
positions (adafuse/member/cache.py `claim`), and the addresses they go to and the runs every row's positions lie in
become two tables on the GPU; each layer then makes two launches, whatever the reads: one writes its new keys and
values where they go (`kernels.write_in_place`), one attends (`kernels.attention_in_place`). No key or value is
copied. Torch's own call (`torch_varlen`, for the passes that need no exactness) takes them packed end to end
(`packed_attention`): the keys of all rows are copied into one tensor for the call, a layer at a time.
"""

from array import array
from dataclasses import dataclass

import torch

from adafuse.backend.cuda import kernels
from adafuse.backend.live import on_device


@dataclass(frozen=True)
class InPlace:
    """What every layer of a pass reads, made once: each sequence's queries (`cu_q`, the longest's count), and per
    layer (a view each, not an index per layer) the slots its new positions are written to, (positions written,
    SLOT_FIELDS), and the runs every row reads, (rows, RUNS_PER, RUN_FIELDS), int64 on the GPU. Made where every
    read's cache holds positions (a merged pass reads after a prompt); None otherwise.

    The host's work grows with the reads and layers by a claim and a buffer's place per read and layer; each row's
    runs are planned once per read (a cache's layers are written alike: adafuse/member/cache.py `run_plan`) and
    placed in every layer by tensor arithmetic."""

    cu_q: torch.Tensor
    max_q: int
    slots: tuple[torch.Tensor, ...]
    runs: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, split, device) -> "InPlace | None":
        if any(cache.get_seq_length() == 0 for cache in split.caches):  # a context read from nothing: no buffer yet
            return None
        layers = len(split.caches[0].layers)
        # per read and layer: its claim's place (7 fields), its sources' places (RUNS_PER x 6); per row: its runs
        # (RUNS_PER x 5); flat, in one buffer each, as Python's ints go into a tensor fastest
        bases, places, plan = array("q"), array("q"), array("q")
        for j, (s, cache) in enumerate(zip(split.spans, split.caches, strict=True)):
            at = None
            for i, layer in enumerate(cache.layers):
                buffer, layer_at = layer.claim(s.width)
                if at is None:
                    at = layer_at
                elif layer_at != at:
                    raise ValueError(f"a cache's layers hold different lengths: {at} in layer 0, {layer_at} in {i}")
                bases.extend(buffer.layout())
                bases.append(at)
                sources = layer.sources()
                for source in sources:
                    places.extend(source.layout())
                places.extend(_NO_PLACES[len(sources)])
            first = cache.layers[0]
            for row, live in enumerate(s.lengths):
                row_plan = first.run_plan(row, s.length + live)
                for run in row_plan:
                    plan.append(j)
                    plan.extend(run)
                plan.extend(_NO_RUNS[len(row_plan)])
        reads = len(split.spans)
        sources, offsets = _positions(split.spans)  # the same in every layer
        slots = _slots(_int64(bases).view(reads, layers, 7).transpose(0, 1), sources, offsets)
        places = _int64(places).view(reads, layers, RUNS_PER, 6).transpose(0, 1)
        runs = _runs(places, _int64(plan).view(-1, RUNS_PER, 5))
        cu_q, _, max_q, _ = sequences(split.spans, device)
        return cls(cu_q, max_q, on_device(slots, device).unbind(), on_device(runs, device).unbind())


RUNS_PER = kernels.RUNS_PER  # a row's runs, and a layer's sources, at most: a stored prefix, a context, a fork's own
_NO_PLACES = [(0,) * (6 * (RUNS_PER - n)) for n in range(RUNS_PER + 1)]  # after n sources, the places no run reads
_NO_RUNS = [(0,) * (5 * (RUNS_PER - n)) for n in range(RUNS_PER + 1)]  # after n runs, the empty ones


def _int64(values: array) -> torch.Tensor:
    """An int64 tensor over `values` (no copy)."""
    return torch.frombuffer(values, dtype=torch.int64) if values else torch.empty(0, dtype=torch.int64)


def _runs(places: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
    """(layers, rows, RUNS_PER, RUN_FIELDS): each row's runs in each layer, from each layer's and read's sources'
    places (`places`, (layers, reads, RUNS_PER, 6): key and value addresses, strides between rows, positions and
    heads, element size) and each row's plan (`plan`, (rows, RUNS_PER, 5): its read, the source, the source's row,
    the first position, the count; a count of 0, no run: all zeros)."""
    read, source, row, start, count = plan.unbind(2)
    place = places[:, read, source]  # (layers, rows, RUNS_PER, 6)
    step = (row * place[..., 2] + start * place[..., 3]) * place[..., 5]
    fields = [place[..., 0] + step, place[..., 1] + step, count.expand_as(step), place[..., 3], place[..., 4]]
    return torch.stack(fields, dim=3) * (count > 0)[..., None]


def _positions(spans) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position a pass writes to its reads' caches (each read's rows, each row's full width: its right padding
    is written as zeros, as alone): its source in the packed row (-1: zeros), and (read, row, position) as offsets."""
    sources, offsets, start = [], [], 0
    for j, s in enumerate(spans):
        for row, live in enumerate(s.lengths):
            sources += [start + p if p < live else -1 for p in range(s.width)]
            offsets += [(j, row, p) for p in range(s.width)]
            start += live
    return torch.tensor(sources, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64).view(-1, 3)


def _slots(bases: torch.Tensor, sources: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """(layers, positions, SLOT_FIELDS): each position's source and the addresses it goes to in each layer, from
    each layer's and read's buffer (`bases`, (layers, reads, 7): key and value addresses, strides between rows,
    positions and heads, element size, where the pass's positions start)."""
    read, row, position = offsets.unbind(1)
    b = bases[:, read]  # (layers, positions, 7)
    step = (row * b[..., 2] + (b[..., 6] + position) * b[..., 3]) * b[..., 5]
    return torch.stack([sources.expand_as(step), b[..., 0] + step, b[..., 1] + step, b[..., 4]], dim=2)


def in_place_attention(module, query, split, kwargs):
    """The `one_call` of our kernel: every row at once, each row's keys and values read where they lie
    (`kernels.attention_in_place`), the layer's new ones written first where they go (`kernels.write_in_place`), both
    from the tables made at the pass's first layer (`InPlace`). The buffers stay alive and nothing else writes them
    during the pass."""
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        return None
    if split.one_call_layout is None:
        split.one_call_layout = InPlace.of(split, query.device) or False
    if split.one_call_layout is False:  # a read's context holds no buffer yet: per request
        return None
    layout = split.one_call_layout
    layer, _, new_keys, new_values = split.new
    split.new = None
    kernels.write_in_place(new_keys[0].transpose(0, 1), new_values[0].transpose(0, 1), layout.slots[layer])
    q = query[0].transpose(0, 1)  # (positions, heads, d): the packed row's positions, row after row
    scale = kwargs.get("scaling") or module.scaling
    out = kernels.attention_in_place(
        q, layout.runs[layer], layout.cu_q, new_keys.shape[1], scale, True, kwargs.get("sliding_window"), layout.max_q
    )
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
        for s, (own, new_keys, new_values) in zip(split.spans, split.per_request(), strict=True):
            k, v = own.update(new_keys, new_values)  # (rows, kv_heads, length + width, d)
            for row, live in enumerate(s.lengths):
                keys.append(k[row, :, : s.length + live].transpose(0, 1))
                values.append(v[row, :, : s.length + live].transpose(0, 1))
        split.new = None
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
