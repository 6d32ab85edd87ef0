"""tools/compare_dtypes.py (float32 against bfloat16 on the paper's pair in shape; results/bench/dtypes.json): every
method decodes one NQ prompt in both dtypes, and each output that differs has its first divergence measured."""

from dataclasses import replace

import pytest

from tools import compare_dtypes
from tools.bench_decode import task_requests


@pytest.mark.slow
def test_every_method_runs_in_both_dtypes_and_each_difference_is_traced(paper_pair_dir, shared_data):
    requests = [replace(r, trace=True) for r in task_requests("nq", 1, shared_data, 3)]
    report = compare_dtypes.compare(paper_pair_dir, requests)
    assert list(report) == list(compare_dtypes.METHODS)
    for name, found in report.items():
        assert found["prompts"] == 1 and found["differ"] in (0, 1), (name, found)
        if name == "adafuse" or name.startswith("single"):  # the methods whose first divergence is measured
            assert len(found["first_divergences"]) == found["differ"], (name, found)
