"""tools/bench_host.py (`bench_decode --only host`) at a small depth: every figure it reports is measured, and its
KV counter sees a copy where the engine makes one (a fork's rows read with their context) and none where it does not."""

import pytest
import torch

from adafuse.backend import MERGED, Execution, Pass, Read
from adafuse.engine.loop import drive
from adafuse.member.cache import fork_cache
from tools.bench_decode import task_requests
from tools.bench_host import Arithmetic, KVCopies, compare_host

pytestmark = pytest.mark.slow

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}  # fmt: skip


def test_the_host_bench_measures_every_figure(shared_data):
    host = compare_host(task_requests("nq", 2, shared_data, budget=4), repeats=1, sizes=SMALL)
    plain = host["pass"]["plain_forward"]
    assert 0 < plain["host_ms"] < plain["ms"]
    assert [p["requests"] for p in host["pass"]["merged"]] == [1, 8, 32]
    assert all(0 < p["host_ms"] < p["ms"] and 0 < p["attention_share"] < 1 for p in host["pass"]["merged"])
    decode = host["decode"]
    for run in [*decode["generate"], decode["adafuse_b8"]]:
        assert run["passes"] > 0 and 0 < run["host_seconds"] < run["seconds"]
    assert decode["adafuse_b8_side_by_side"]["passes"] == decode["adafuse_b8"]["passes"]  # the same passes
    assert set(decode["ratios"]) == {"adafuse_b8_over_summed_generate", "adafuse_b8_side_by_side_over_summed_generate"}
    assert set(decode["host_ratios"]) == {"adafuse_b8_over_summed_generate"}
    assert host["copies"]["passes"] > 0 and host["copies"]["kv_bytes_written_per_pass"] > 0


def test_the_counter_sees_the_kv_a_pass_copies_and_not_what_it_writes(tiny_shaped):
    member = tiny_shaped[0].clone()
    with KVCopies() as counted:
        drive(member.start("Question: who wrote hamlet\nAnswer:"))
        backend, prepared = member.runner.backend, member.runner.prepared
        context = Read(member.cache, torch.tensor([[5]]))
        backend.execute([Pass(MERGED, prepared, (context,))], Execution())
        assert counted.copied == 0 and counted.written > 0  # a context grows in place
        fork = fork_cache(member.cache, 3, member.cache.get_seq_length())
        backend.execute([Pass(MERGED, prepared, (Read(fork, torch.tensor([[5], [6], [7]])),))], Execution())
        assert counted.copied > 0  # three rows, each read as its context and its own position


def test_the_arithmetic_timer_sees_the_calls_of_the_untouched_model_and_of_the_engine(tiny_shaped):
    member, linear = tiny_shaped[0].clone(), torch.nn.functional.linear
    with Arithmetic() as arithmetic:
        drive(member.start("Question: who wrote hamlet\nAnswer:"))
    assert all(seconds > 0 for seconds in arithmetic.seconds.values())  # linear, attention, log-softmax
    assert torch.nn.functional.linear is linear  # put back
