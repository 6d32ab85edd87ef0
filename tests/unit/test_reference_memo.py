"""The session memo of the reference's cache-free passes (oracles/reference.py: LogprobMemo)."""

import torch

from oracles.reference import LogprobMemo


class Model:
    pass


def test_a_remembered_pass_is_returned_for_its_model_tokenizer_ids_and_row_count_only():
    memo = LogprobMemo(max_bytes=10**6)
    model, tokenizer, rows = Model(), object(), torch.full((2, 3), 1.0)
    assert memo.get(model, tokenizer, (1, 2, 3), 2) is None
    memo.put(model, tokenizer, (1, 2, 3), 2, rows)
    assert memo.get(model, tokenizer, (1, 2, 3), 2) is rows and (memo.hits, memo.misses) == (1, 1)
    # the same ids keeping another number of rows, a prefix of them, a longer pass, another model or tokenizer
    for other in [(1, 2, 3), 1], [(1, 2), 2], [(1, 2, 3, 4), 2]:
        assert memo.get(model, tokenizer, *other) is None
    assert memo.get(Model(), tokenizer, (1, 2, 3), 2) is None
    assert memo.get(model, object(), (1, 2, 3), 2) is None


def test_the_least_recently_used_passes_leave_past_the_bound():
    memo = LogprobMemo(max_bytes=250)
    model, tokenizer = Model(), object()
    for ids in [(1,), (2,)]:
        memo.put(model, tokenizer, ids, 1, torch.zeros(1, 25))  # 100 bytes each
    memo.get(model, tokenizer, (1,), 1)  # (2,) is now the least recently used
    memo.put(model, tokenizer, (3,), 1, torch.zeros(1, 25))
    assert memo.bytes == 200 and memo.get(model, tokenizer, (2,), 1) is None
    assert memo.get(model, tokenizer, (1,), 1) is not None and memo.get(model, tokenizer, (3,), 1) is not None
    memo.put(model, tokenizer, (9,), 1, torch.zeros(1, 100))  # larger than the bound: not kept
    assert memo.get(model, tokenizer, (9,), 1) is None and memo.bytes == 200
    memo.put(model, tokenizer, (1,), 1, torch.zeros(1, 25))  # again under the same key: counted once
    assert memo.bytes == 200
