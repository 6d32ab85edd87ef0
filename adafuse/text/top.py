"""The most probable tokens of a distribution on the host, as torch's argmax and topk name them, in a tenth of the
time.

A pass's results come back to the host whole (adafuse/backend/cuda/backend.py `_to_host`), and a decode asks for a
row's best token or its two best probabilities thousands of times (every step of every word, every margin: 6,500
times in tools/bench_host.py's 16-prompt decode). Torch's CPU argmax and topk scan a 128k-token row in 150 to
300 us (a loop that keeps the index with the value); numpy's argmax scans it in 12 us. The index is torch's: the
first of the largest, a NaN counted as the largest (both libraries do so)."""

import torch

_SCANNED = (torch.float32, torch.float64)  # numpy reads these as they are; any other dtype goes to torch


def _scanned(row: torch.Tensor) -> bool:
    """Whether numpy can read `row` as it is: a CPU tensor of a dtype it knows that autograd does not track."""
    return row.device.type == "cpu" and row.dtype in _SCANNED and not row.requires_grad


def best(row: torch.Tensor) -> int:
    """The index of the largest value of a 1-d `row`: `int(row.argmax())`."""
    if not _scanned(row):
        return int(row.argmax())
    return int(row.numpy().argmax())


def top_two(row: torch.Tensor) -> torch.Tensor:
    """The two largest values of a 1-d `row`, largest first: `row.topk(2).values` (a new tensor, row's dtype)."""
    if not _scanned(row) or row.numel() < 2:
        return row.topk(2).values
    values = row.numpy()
    first = int(values.argmax())
    # the second: the largest of the rest, the one before the first where the two sides tie
    second = first + 1 + int(values[first + 1 :].argmax()) if first + 1 < values.size else None
    if first > 0:
        earlier = int(values[:first].argmax())
        if second is None or not values[earlier] < values[second]:
            second = earlier
    return row[[first, second]]
