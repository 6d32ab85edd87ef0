"""adafuse/text/top.py: the best index and the two best values of a row, as torch's argmax and topk give them."""

import pytest
import torch

from adafuse.text.top import best, top_two


def rows() -> list[torch.Tensor]:
    """Log-softmax rows as a pass returns them, with ties, -inf (masked ids) and the largest at either end; views
    into a packed result; and dtypes numpy does not read."""
    torch.manual_seed(0)
    packed = torch.randn(6, 50).log_softmax(-1)
    tied = packed[0].clone()
    tied[[7, 31, 44]] = tied.max() + 1  # three share the largest
    masked = packed[1].masked_fill(torch.arange(50) % 3 == 0, float("-inf"))
    first, last = packed[2].clone(), packed[3].clone()
    first[0], last[-1] = 5.0, 5.0
    second_tied = packed[4].clone()
    second_tied[[3, 40]] = 4.0  # the runner-up tied on both sides of the largest
    second_tied[20] = 6.0
    return [
        *packed,
        tied,
        masked,
        first,
        last,
        second_tied,
        packed[:, 5],  # a strided view
        torch.tensor([float("-inf"), float("-inf"), -1.0]),
        torch.tensor([2.0, 2.0]),
        packed[5].double(),
        packed[5].half(),
        packed[5].bfloat16(),
    ]


@pytest.mark.parametrize("row", rows(), ids=lambda r: f"{r.dtype}-{r.numel()}-{r.stride()}")
def test_the_best_index_and_two_best_values_are_torch_s(row):
    assert best(row) == int(row.argmax())
    top = top_two(row)
    assert top.dtype == row.dtype and torch.equal(top, row.topk(2).values)
    assert torch.equal(top.exp(), row.topk(2).values.exp())  # a margin's bits (adafuse/methods/adafuse.py)


def test_inference_tensors_and_tracked_ones_are_read_too():
    with torch.inference_mode():
        row = torch.randn(1000).log_softmax(-1)
    tracked = torch.randn(1000, requires_grad=True)
    for r in (row, tracked):
        assert best(r) == int(r.argmax()) and torch.equal(top_two(r), r.topk(2).values)


def test_a_nan_is_the_largest_as_in_torch():
    row = torch.tensor([0.5, float("nan"), 0.9, float("nan")])
    assert best(row) == int(row.argmax()) == 1
    assert torch.isnan(top_two(row)[0]) and torch.isnan(row.topk(2).values[0])
