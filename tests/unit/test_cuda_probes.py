"""The CUDA backend's probes (adafuse/backend/cuda/choice.py `rows_alone`, `requests_alone`): the bits-alone loops the
backend runs at start and the GPU check runs op by op. They name every row (request) count at which an op gives a
row other bits among others than alone, stop at the first where asked, and time one call at the counts asked. The ops
here are elementwise, so no verdict hangs on the host's BLAS."""

import torch

from adafuse.backend.cuda.choice import REQUESTS, ROWS, requests_alone, requests_keep_bits, rows_alone, rows_keep_bits

LIKE = torch.empty(0, dtype=torch.float32)
COUNTS = ROWS["cpu"]


def keeps(x: torch.Tensor) -> torch.Tensor:
    return x * 3 - 1


def follows_the_count(x: torch.Tensor) -> torch.Tensor:
    """A row's result moves with the number of rows beside it, as a kernel chosen by the row count would."""
    return x + len(x)


def test_an_op_that_keeps_a_rows_bits_is_found_to_and_timed_where_asked():
    found = rows_alone(keeps, 16, LIKE, timed=(1, 8))
    assert found.keeps_bits and found.differs_at == []
    assert set(found.ms) == {1, 8} and all(ms > 0 for ms in found.ms.values())
    assert rows_keep_bits(keeps, 16, LIKE)


def test_an_op_whose_rows_follow_the_count_differs_at_every_count_but_one():
    found = rows_alone(follows_the_count, 16, LIKE)
    assert not found.keeps_bits and found.differs_at == [n for n in COUNTS if n > 1] and found.ms == {}
    assert rows_alone(follows_the_count, 16, LIKE, first=True).differs_at == [COUNTS[1]]  # the first count is 1
    assert not rows_keep_bits(follows_the_count, 16, LIKE)


def per_request(q, k, v, cu_q, cu_k, scale, window, max_q, max_k):
    """Attention's shape, each query's output its own (a request's bits cannot move with the others)."""
    return q * scale


def moves_with_the_requests(q, k, v, cu_q, cu_k, scale, window, max_q, max_k):
    return q * scale + (len(cu_q) - 1)


def test_attention_that_keeps_a_requests_bits_is_found_to_and_one_that_does_not_is_named_at_each_count():
    assert requests_alone(per_request, 4, 2, 16, LIKE).differs_at == []
    timed = requests_alone(per_request, 4, 2, 16, LIKE, timed=(2,))
    assert list(timed.ms) == [2] and timed.ms[2] > 0
    assert requests_alone(moves_with_the_requests, 4, 2, 16, LIKE).differs_at == [n for n in REQUESTS if n > 1]
    assert requests_keep_bits(per_request, 4, 2, 16, LIKE) and not requests_keep_bits(
        moves_with_the_requests, 4, 2, 16, LIKE
    )
