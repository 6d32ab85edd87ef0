"""tools/bench_host.py (`bench_decode --only host`) at a small depth: every figure it reports is measured, and its
KV counter sees a copy where the engine makes one (a fork's rows read with their context) and none where it does not."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from adafuse.backend import MERGED, Execution, Pass, Read
from adafuse.backend.cuda.backend import CudaBackend
from adafuse.backend.probe_store import ProbeStore
from adafuse.engine.loop import drive
from adafuse.member.cache import fork_cache
from tools import make_paper_pair
from tools.bench_decode import task_requests
from tools.bench_host import (
    EVERY_KERNEL,
    Arithmetic,
    KernelStandIns,
    KVCopies,
    compare_host,
    deep_pair,
    prompt_context,
)

pytestmark = pytest.mark.slow

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}  # fmt: skip


def test_the_host_bench_measures_every_figure(shared_data):
    host = compare_host(task_requests("nq", 2, shared_data, budget=4), repeats=1, sizes=SMALL, rounds=1)
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
    kernel_path = host["kernel_path"]
    launches = {p["launches"] for p in kernel_path["merged"]}
    assert len(launches) == 1 and launches.pop() > 0  # as many for 32 requests as for one: none per request
    assert all(0 < p["host_ms"] < p["ms"] for p in kernel_path["merged"])
    run = kernel_path["adafuse_b8"]
    assert run["passes"] > 0 and 0 < run["host_seconds"] < run["seconds"] and run["launches"] > 0
    assert 0 < run["tables_seconds"] < run["host_seconds"]
    assert [g["passes"] for g in kernel_path["generate"]] == [g["passes"] for g in decode["generate"]]
    assert all(0 < g["host_seconds"] < g["seconds"] for g in kernel_path["generate"])
    assert kernel_path["adafuse_b8_host_over_summed_generate"] > 0


def test_the_stand_ins_compute_what_the_model_computes():
    """The kernel path's stand-ins read and write the KV where the backend's tables say: a merged pass of a step
    after a prompt and a fork of three rows gives each row the logits of the untouched model's forward over its
    whole sequence."""
    path = deep_pair(SMALL) / make_paper_pair.DEFAULT[0]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    backend = CudaBackend("cpu", store=ProbeStore(None))
    prompts = [tokenizer.encode(p) for p in ("Question: who wrote hamlet\nAnswer:", "Question: where is Lyon?")]
    with KernelStandIns() as stand_ins, torch.inference_mode():
        prepared = backend.prepare(model)
        backend.choices[model] = EVERY_KERNEL
        contexts = [prompt_context(backend, prepared, ids) for ids in prompts]
        step, fork = torch.tensor([[11]]), torch.tensor([[5, 6], [7, 8], [9, 10]])
        reads = (Read(contexts[0], step), Read(fork_cache(contexts[1], 3, len(prompts[1])), fork))
        stand_ins.launches = 0
        (ran,) = backend.execute([Pass(MERGED, prepared, reads)], Execution())
        assert stand_ins.launches > 0  # the pass ran through the stand-ins
        rows = [prompts[0] + step[0].tolist()] + [prompts[1] + row for row in fork.tolist()]
        alone = [plain(torch.tensor([ids])).logits[0, -width:] for ids, width in zip(rows, (1, 2, 2, 2))]
    got = [ran.results[0][0], *ran.results[1]]
    assert all(torch.allclose(g, a, atol=1e-4) for g, a in zip(got, alone, strict=True))


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
