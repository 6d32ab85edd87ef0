"""The session memo of the reference's log-probability rows (adafuse/reference.py: LogprobMemo)."""

import torch

from oracles.reference import LogprobMemo


class Model:
    pass


def test_a_remembered_row_is_returned_for_its_model_tokenizer_and_prefix_only():
    memo = LogprobMemo(max_bytes=10**6)
    model, tokenizer, row = Model(), object(), torch.full((3,), 1.0)
    assert memo.get(model, tokenizer, (1, 2)) is None
    memo.put(model, tokenizer, (1, 2), row)
    assert memo.get(model, tokenizer, (1, 2)) is row and (memo.hits, memo.misses) == (1, 1)
    # another prefix (a shorter one too), another model or tokenizer: not remembered
    for other in [(model, tokenizer, (1, 3)), (model, tokenizer, (1,)), (Model(), tokenizer, (1, 2))]:
        assert memo.get(*other) is None
    assert memo.get(model, object(), (1, 2)) is None


def test_the_least_recently_used_rows_leave_past_the_bound():
    memo = LogprobMemo(max_bytes=250)
    model, tokenizer = Model(), object()
    for prefix in [(1,), (2,)]:
        memo.put(model, tokenizer, prefix, torch.zeros(25))  # 100 bytes each
    memo.get(model, tokenizer, (1,))  # (2,) is now the least recently used
    memo.put(model, tokenizer, (3,), torch.zeros(25))
    assert memo.bytes == 200 and memo.get(model, tokenizer, (2,)) is None
    assert memo.get(model, tokenizer, (1,)) is not None and memo.get(model, tokenizer, (3,)) is not None
    memo.put(model, tokenizer, (9,), torch.zeros(100))  # larger than the bound: not kept
    assert memo.get(model, tokenizer, (9,)) is None and memo.bytes == 200
    memo.put(model, tokenizer, (1,), torch.zeros(25))  # again under the same key: counted once
    assert memo.bytes == 200
