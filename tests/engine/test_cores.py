"""Threads side by side share the cores in their multiplies (adafuse/backend/cpu/cores.py, a CPU device of the backend),
and no bit changes."""

import ctypes
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from adafuse.backend import backend_for
from adafuse.backend.cpu import tiles
from adafuse.backend.cpu.backend import CpuBackend
from adafuse.backend.cpu.cores import CoreShare
from adafuse.engine.executor import Executor
from adafuse.ensemble import cpu_options

CORES = backend_for(torch.device("cpu")).cores
PROBES = backend_for(torch.device("cpu")).probes

PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "Question: Who wrote Hamlet?\nAnswer:",
    "Question: How many legs does a spider have?\nAnswer:",
]


@pytest.fixture(scope="module")
def mkl(require):
    """MKL's own count of the calling thread's threads; the torch wheels this project installs link MKL."""
    require(CORES.can_share, "MKL's per-thread thread count (a torch build with MKL)")
    library = next((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*"))
    count = ctypes.CDLL(str(library)).mkl_get_max_threads
    count.restype = ctypes.c_int
    return count


def test_each_thread_of_a_share_multiplies_on_its_part_of_the_cores_and_the_last_one_on_all(mkl):
    threads = torch.get_num_threads()
    both_in, first_left = threading.Barrier(2, timeout=10), threading.Event()
    seen = {}

    def first(share):
        both_in.wait()
        seen["first"] = CORES.blas_threads(share)
        share.leave()
        first_left.set()

    def second(share):
        both_in.wait()
        seen["second"] = CORES.blas_threads(share)
        first_left.wait(10)
        seen["alone"] = CORES.blas_threads(share)
        share.leave()

    share = CoreShare(2)
    runs = [threading.Thread(target=f, args=(share,)) for f in (first, second)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert seen == {"first": max(1, threads // 2), "second": max(1, threads // 2), "alone": None}
    assert CORES.blas_threads(None) is None  # a thread outside any share
    before = mkl()
    with CORES.mkl_threads(1):
        assert mkl() == 1
    assert mkl() == before


def recording_mkl_threads(monkeypatch) -> list:
    """Every MKL thread count a multiply asks for from here on (None: all the cores)."""
    counts, mkl_threads = [], CORES.mkl_threads
    monkeypatch.setattr(CORES, "mkl_threads", lambda count: counts.append(count) or mkl_threads(count))
    return counts


def test_a_batched_decode_multiplies_on_one_thread_per_model_and_keeps_every_bit(tiny, monkeypatch):
    """Both models' passes of a step run side by side, each multiply on its share of the cores; the outputs
    and every score of the trace equal the run where every multiply uses all the cores."""
    tiny.decode_batch(PROMPTS, max_new_tokens=1, batch_size=3)  # both runs below then read the prompts alike
    counts = recording_mkl_threads(monkeypatch)
    shared = tiny.decode_batch(PROMPTS, stop=["\n"], max_new_tokens=8, trace=True, batch_size=3)
    if torch.get_num_threads() > 1:
        assert 1 in counts  # some multiplies ran on one thread while the other model's pass ran
    monkeypatch.setattr(CORES, "_set_local", None)
    counts.clear()
    every_core = tiny.decode_batch(PROMPTS, stop=["\n"], max_new_tokens=8, trace=True, batch_size=3)
    assert not [count for count in counts if count is not None]
    for a, b in zip(shared, every_core):
        assert (a.text, a.ids) == (b.text, b.ids)
        assert [[c.scores for c in r.candidates] for r in a.trace.rounds] == [
            [c.scores for c in r.candidates] for r in b.trace.rounds
        ]


def test_a_multiply_whose_bits_change_with_its_threads_runs_on_all_of_them(monkeypatch):
    weight, x = torch.randn(8, 32), torch.randn(4, 32)
    counts = recording_mkl_threads(monkeypatch)
    monkeypatch.setattr(CORES, "_set_local", lambda count: 0)  # a share is in force even without MKL
    share = CoreShare(2)  # the other thread of the share never leaves: this one multiplies on its part
    threads = CORES.blas_threads(share)
    key = (tiles.kernel_key(weight, None), 4, threads)
    monkeypatch.setitem(PROBES.fewer_threads, key, False)
    assert torch.equal(tiles.linear(PROBES, x, weight, None, share), F.linear(x, weight))
    monkeypatch.setitem(PROBES.fewer_threads, key, True)
    tiles.linear(PROBES, x, weight, None, share)
    assert counts == [threads]  # the first multiply asked for no count: all the cores


def test_passes_one_model_after_the_other_never_overlap_use_every_core_and_keep_every_bit(tiny, monkeypatch):
    """`side_by_side=False`: no pass of one model runs while the other's does, every multiply asks for all the
    cores, the outputs and scores are those of passes side by side, and each model's pass seconds are counted."""
    tiny.decode_batch(PROMPTS, max_new_tokens=1, batch_size=3)  # both runs below then read the prompts alike
    side_by_side = tiny.decode_batch(PROMPTS, stop=["\n"], max_new_tokens=4, trace=True, batch_size=3)
    spans, threads = [], []
    run_pass, names = CpuBackend.run, {id(m.model): m.name for m in tiny.members}

    def recording(self, p, context):
        start = time.perf_counter()
        threads.append(CORES.blas_threads(context.own.share))
        try:
            return run_pass(self, p, context)
        finally:
            spans.append((names[id(p.model.model)], start, time.perf_counter()))

    monkeypatch.setattr(CpuBackend, "run", recording)
    executor = Executor(options=cpu_options(side_by_side=False))
    one_after = tiny.decode_batch(PROMPTS, stop=["\n"], max_new_tokens=4, trace=True, batch_size=3, executor=executor)
    assert set(threads) == {None}
    spans.sort(key=lambda span: span[1])
    assert {name for name, _, _ in spans} == {m.name for m in tiny.members}
    assert all(end <= next_start for (_, _, end), (_, next_start, _) in zip(spans, spans[1:]))
    for a, b in zip(side_by_side, one_after):
        assert (a.text, a.ids) == (b.text, b.ids)
        assert [[c.scores for c in r.candidates] for r in a.trace.rounds] == [
            [c.scores for c in r.candidates] for r in b.trace.rounds
        ]
    report = executor.report()
    for m in tiny.members:
        measured = sum(end - start for name, start, end in spans if name == m.name)
        assert 0 < report[m.name]["seconds"] <= measured
