"""The session memo of the reference's log-probabilities (adafuse/reference.py: LogprobMemo)."""

import torch

from adafuse.reference import LogprobMemo


class Model:
    pass


def test_a_remembered_result_is_returned_without_computing_it_again():
    memo, calls = LogprobMemo(max_bytes=10**6), []

    def compute(value):
        calls.append(value)
        return torch.full((2, 3), float(value))

    model, tokenizer = Model(), object()
    first = memo.get(model, tokenizer, (1, 2), 2, lambda: compute(1))
    again = memo.get(model, tokenizer, (1, 2), 2, lambda: compute(2))
    assert again is first and calls == [1] and (memo.hits, memo.misses) == (1, 1)
    # other ids, another number of positions, another model or tokenizer: each computed
    memo.get(model, tokenizer, (1, 3), 2, lambda: compute(3))
    memo.get(model, tokenizer, (1, 2), 1, lambda: compute(4))
    memo.get(Model(), tokenizer, (1, 2), 2, lambda: compute(5))
    memo.get(model, object(), (1, 2), 2, lambda: compute(6))
    assert calls == [1, 3, 4, 5, 6]


def test_the_least_recently_used_entries_leave_past_the_bound():
    row = torch.zeros(25)  # 100 bytes
    memo = LogprobMemo(max_bytes=250)
    model, tokenizer, computed = Model(), object(), []

    def get(ids):
        return memo.get(model, tokenizer, ids, 1, lambda: computed.append(ids) or row.clone())

    get((1,)), get((2,)), get((1,)), get((3,))  # (2,) is the least recently used when (3,) arrives
    assert memo.bytes == 200 and computed == [(1,), (2,), (3,)]
    get((1,)), get((2,))
    assert computed == [(1,), (2,), (3,), (2,)] and memo.bytes <= 250
    big = memo.get(model, tokenizer, (9,), 1, lambda: torch.zeros(100))  # larger than the bound: not kept
    assert big.numel() == 100 and memo.bytes <= 250
