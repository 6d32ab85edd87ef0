"""Only the positions a pass reads are computed: the real ids of rows of unequal length, and logits only where
someone reads them.

A pass alone over rows of unequal length (a fork whose branches ended early, candidates of unequal length)
keeps its padded layout, (rows, width), but its linear layers multiply only each row's real positions (the
others stay zeros: finite, and never read by a real position, which causal attention keeps from the padding
after it), and the vocabulary projection makes logits for the real positions alone (`only_live`). A packed
pass (adafuse/backend/split_pass.py) has no padding; its projection makes logits where the pass reads them
(a prompt's last position alone). Which positions are live is part of the pass's forward context
(adafuse/backend/forward.py); a row's bits are the same either way, as every multiply computes a row as in
its tile (adafuse/backend/cpu/tiles.py).
"""

from dataclasses import dataclass

import torch

from adafuse.backend.forward import current


@dataclass(frozen=True)
class LivePositions:
    """The positions of a pass whose results are read: (rows, width) of the pass's input, and the flat
    indices (row * width + position) of the live ones (None: every one, a packed pass)."""

    shape: tuple[int, int]
    index: torch.Tensor | None
    logits: torch.Tensor  # the flat indices whose logits are made: the live ones, or a row's last where asked


def padded_rows(lengths: list[int] | None, width: int, device, last: list[bool] | None = None) -> LivePositions | None:
    """The live positions of a pass of len(lengths) rows of `width` positions where row i reads its first
    lengths[i] positions; `last[i]`: row i's logits at its last live position alone. None where every
    position is live and every logit read (nothing to leave out)."""
    last = last or [False] * (0 if lengths is None else len(lengths))
    if lengths is None or all(n >= width for n in lengths) and not any(last):
        return None
    positions, ends = torch.arange(width), torch.tensor(lengths)[:, None]
    live = positions < ends
    index = logits = live_index(lengths, width, device)
    if any(last):
        read = live & (positions >= torch.where(torch.tensor(last)[:, None], ends - 1, 0))
        logits = on_device(read.flatten().nonzero().squeeze(1), device)
    return LivePositions((len(lengths), width), index, logits)


def packed_row(count: int, logits: torch.Tensor | None) -> LivePositions | None:
    """A packed pass of `count` positions, every one live, whose logits are made at `logits` alone (None:
    at every position, nothing to leave out)."""
    return None if logits is None else LivePositions((1, count), None, logits)


def live_index(lengths: list[int], width: int, device) -> torch.Tensor:
    """The flat indices (row * width + position) of the first lengths[i] positions of each row i."""
    return on_device((torch.arange(width) < torch.tensor(lengths)[:, None]).flatten().nonzero().squeeze(1), device)


def on_device(values, device) -> torch.Tensor:
    """`values` (a list of ints, or a CPU tensor) on `device`. To a GPU from pinned memory without waiting: the
    host goes on launching the pass, and the copy is ordered before the kernels that read it."""
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def only_live(x: torch.Tensor, features: int, multiply, pack: bool = False) -> torch.Tensor:
    """`multiply` (rows, in) -> (rows, features) applied to x (..., in). In a pass with live positions, for an
    x laid out as the pass's positions, only the live rows are multiplied. The others are zeros, or, with
    `pack` (the vocabulary projection, the last layer), left out: the result is (1, positions read,
    features), the logits of the live positions (of a row's last alone where asked) in row order, so that no
    logits are made for padding or for positions no one reads (`packed_logits` reads them)."""
    live = current().live
    flat = x.reshape(-1, x.shape[-1])
    if live is None or tuple(x.shape[:-1]) != live.shape:
        return multiply(flat).reshape(*x.shape[:-1], features)
    if pack:
        return multiply(flat.index_select(0, live.logits)).unsqueeze(0)
    if live.index is None:
        return multiply(flat).reshape(*x.shape[:-1], features)
    computed = multiply(flat.index_select(0, live.index))
    out = flat.new_zeros(flat.shape[0], features)
    out.index_copy_(0, live.index, computed)
    return out.reshape(*x.shape[:-1], features)


def packed_logits(logits: torch.Tensor, lengths: list[int], width: int, last: list[bool] | None = None) -> torch.Tensor:
    """The logits of a pass run with `padded_rows(lengths, width, last)`, as (positions read, vocab) in row
    order: as the packed head gave them (1, read, vocab), or taken from a head that gave every position
    (rows, width, vocab): a pass with no padding, or a head the backend could not wrap."""
    last = last or [False] * len(lengths)
    if logits.shape[:2] == (len(lengths), width):
        if all(length == width for length in lengths) and not any(last):
            return logits.reshape(-1, logits.shape[-1])
        return torch.cat(
            [logits[row, length - 1 if one else 0 : length] for row, (length, one) in enumerate(zip(lengths, last))]
        )
    read = sum(1 if one else length for length, one in zip(lengths, last))
    if logits.shape[:2] != (1, read):
        raise AssertionError(f"logits of shape {tuple(logits.shape)} for rows of {lengths} real positions")
    return logits[0]
