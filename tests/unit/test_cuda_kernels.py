"""The CUDA backend's kernels (adafuse/backend/cuda/kernels.py), run on this CPU through their registered torch ops
under Triton's interpreter: a row's bits (a request's, for attention) alone equal its bits among 1 to 64 rows, at
the first, a middle and the last place; each kernel agrees with torch's own within float32 and bfloat16
tolerances; and the stock kernel that motivates them (F.linear on this CPU) does not keep a row's bits. Besides,
Triton's GPU compiler (no GPU needed) compiles each kernel as its op launches it for the A100 and the H100. The
bits of the compiled kernels on a GPU are the GPU check's to confirm (tools/gpu_check).

Triton reads TRITON_INTERPRET when it is first imported, long before this file in the suite's processes
(tests/support/interpreter.py), so the tests below are collected only in a process started with
TRITON_INTERPRET=1, and in any other `test_kernels_under_the_interpreter` runs this file again in such a process
and fails with its report. `TRITON_INTERPRET=1 pytest -n 0 tests/unit/test_cuda_kernels.py` runs them directly.
"""

import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from adafuse.backend.cuda import available
from tests.support.interpreter import (
    HOSTILE_BLAS,
    compiled,
    interpreted,
    interpreter_runs,
    matmul_moves_a_row,
    openblas_kernels,
    run_interpreted,
    triton_at_least,
)

COUNTS = (1, 2, 3, 7, 16, 33, 64)  # rows (requests) in a call
EACH_ALONE = 32  # rows (requests) of a call each compared with itself alone
DTYPES = (torch.float32, torch.bfloat16)
# Within dtype tolerances: float32 sums in another order than torch; bfloat16 rounds its outputs once or twice.
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}
CHILD_SECONDS = 600  # the whole file, interpreted: about 30 s on 2 shared cores


@compiled
def test_kernels_under_the_interpreter(require):
    """This file's tests, in a child process started with TRITON_INTERPRET=1; its report on failure."""
    require(interpreter_runs(), "Triton 3.7 or newer, whose interpreter runs (the `interpreter` extra)")
    report = run_interpreted(__file__, CHILD_SECONDS)
    assert " deselected" not in report, report
    # the one skip allowed: the stock control, on a machine whose F.linear happens to keep a row's bits
    skips = [line for line in report.splitlines() if line.startswith("SKIPPED") and "no control to show" not in line]
    assert not skips, report


# the bit-for-bit tests of the kernels that multiply (a -k expression)
BITS_TESTS = "linear_row_alone or varlen_attention_request_alone or query_count"


def other_blas() -> list[dict[str, str]]:
    """BLAS settings besides the child's own (HOSTILE_BLAS): one thread for OpenBLAS, MKL and OpenMP alike, and
    two with OpenBLAS's Zen kernel where this CPU runs it (the kernel of AMD EPYCs without AVX-512)."""
    one, two = ({f"{lib}_NUM_THREADS": str(n) for lib in ("OPENBLAS", "MKL", "OMP")} for n in (1, 2))
    return [one, ({"OPENBLAS_CORETYPE": "Zen"} if "Zen" in openblas_kernels() else {}) | two]


@compiled
def test_the_childs_blas_would_move_a_row_if_a_verdict_read_it(require):
    """The child runs under a BLAS whose float32 matmul gives a row other bits at another place of a tile, so its
    passing bit-for-bit tests show that no verdict there reads the host's BLAS (tests/support/interpreter.py)."""
    if not HOSTILE_BLAS:
        pytest.skip("no OpenBLAS kernel known to move a row's bits runs on this CPU (x86-64 with AVX2 needed)")
    assert matmul_moves_a_row(HOSTILE_BLAS)


@compiled
@pytest.mark.parametrize("blas", other_blas(), ids=lambda blas: ",".join(f"{k}={v}" for k, v in blas.items()))
def test_the_bits_hold_under_other_blas_kernels_and_thread_counts(require, blas):
    """This file's bit-for-bit tests, again in a child under other BLAS settings: the same verdicts."""
    require(interpreter_runs(), "Triton 3.7 or newer, whose interpreter runs (the `interpreter` extra)")
    run_interpreted(__file__, CHILD_SECONDS, blas=blas, select=BITS_TESTS)


@pytest.fixture(scope="module")
def kernels(require):
    require(available(), "triton")
    from adafuse.backend.cuda import kernels

    return kernels


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def assert_same_bits(alone: torch.Tensor, among: torch.Tensor, what: str) -> None:
    assert alone.dtype == among.dtype and alone.shape == among.shape, what
    assert torch.equal(bits(alone), bits(among)), f"{what}: differs by up to {(alone - among).abs().max().item()}"


def places(n: int) -> list[int]:
    """The first, a middle and the last place among n."""
    return sorted({0, n // 2, n - 1})


def random(*shape: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def spread(*shape: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Random values of magnitudes from 1e-3 to 1e3, so that a sum of their squares rounds differently in another
    order (plain random values of one size often round alike, and would hide a changed order)."""
    generator = torch.Generator().manual_seed(seed)
    magnitudes = 10 ** (6 * torch.rand(*shape, generator=generator) - 3)
    return (torch.randn(*shape, generator=generator) * magnitudes).to(dtype)


def check_rows(op, probe: torch.Tensor, filler: torch.Tensor, counts=COUNTS) -> None:
    """op(rows)'s row for `probe` alone equals it at every place of batches of `counts` rows (the rest: filler), and
    each row of the largest batch equals that row alone. (Many rows, since where a row's result hangs on one sum, as
    RMSNorm's on its mean square, another order changes that sum's rounding, and so the row's bits, only sometimes.)"""
    alone = op(probe[None])[0]
    for n in counts:
        batch = filler[:n].clone()
        batch[places(n)] = probe
        out = op(batch)
        for i in places(n):
            assert_same_bits(alone, out[i], f"row {i} of {n}")
    batch = filler[:EACH_ALONE]
    out = op(batch)
    for i, row in enumerate(batch):
        assert_same_bits(op(row[None])[0], out[i], f"row {i} of {len(batch)}, each alone")


# --- the ops are registered and run interpreted ---------------------------------------------------------------------


@interpreted
def test_the_ops_run_interpreted(kernels):
    from triton.runtime.interpreter import InterpretedFunction

    assert kernels.interpreting() and isinstance(kernels._linear_kernel, InterpretedFunction)
    assert kernels.log_softmax(random(2, 8)).shape == (2, 8)


@compiled
def test_a_cpu_tensor_needs_the_interpreter(kernels):
    """Where Triton compiles (the suite's processes), an op on CPU tensors says how to run it on the CPU."""
    assert not kernels.interpreting()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.log_softmax(random(2, 8))


def attention_args():
    q, k, v = random(5, 4, 16), random(9, 2, 16, seed=1), random(9, 2, 16, seed=2)
    return q, k, v, torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32), 0.25


@interpreted
@pytest.mark.parametrize(
    "op, args",
    [
        ("linear", lambda: (random(3, 20), random(17, 20, seed=1), random(17, seed=2))),
        ("rms_norm", lambda: (random(3, 20), random(20, seed=1), 1e-6, 1.0, False)),
        ("log_softmax", lambda: (random(3, 20),)),
        ("varlen_attention", lambda: (*attention_args(), True, 3, None)),
    ],
)
def test_the_registered_ops_pass_torch_library_checks(kernels, op, args):
    """Schema, and the fake (meta) kernel's shapes against the real kernel's (torch.library.opcheck)."""
    torch.library.opcheck(getattr(torch.ops.adafuse, op).default, args(), test_utils=("test_schema", "test_faketensor"))


def launches(kernels, monkeypatch, dtype) -> list:
    """(kernel, positional arguments, keyword arguments) of each launch the ops make, recorded, not run: linear with
    and without bias, both RMSNorm formulas, log-softmax, attention causal with a window and without a mask."""
    made = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: made.append((self.kernel, args, kwargs))

    monkeypatch.setattr(kernels, "_launchable", lambda *tensors: None)  # CPU tensors, never launched
    for name in ("_linear_kernel", "_rms_norm_kernel", "_log_softmax_kernel", "_attention_kernel", "_write_kernel"):
        monkeypatch.setattr(kernels, name, Recorder(getattr(kernels, name)))
    x, weight = random(3, 96, dtype=dtype), random(80, 96, dtype=dtype)
    kernels._linear(x, weight, random(80, dtype=dtype))
    kernels._linear(x, weight, None)
    kernels._rms_norm(x, random(96, dtype=dtype), 1e-6, 0.0, True)
    kernels._rms_norm(x, random(96, dtype=dtype), 1e-6, 1.0, False)
    kernels._log_softmax(x)
    q, k = random(5, 4, 128, dtype=dtype), random(9, 2, 128, dtype=dtype)
    cu_q, cu_k = torch.tensor([0, 2, 5]), torch.tensor([0, 4, 9])
    kernels._varlen_attention(q, k, k, cu_q, cu_k, 0.1, True, 4, None)
    kernels._varlen_attention(q, k, k, cu_q, cu_k, 0.1, False, None, None)
    kernels._write_in_place(k, k, torch.zeros(4, kernels.SLOT_FIELDS, dtype=torch.int64))
    monkeypatch.undo()
    return made


def launched_source(kernel, args: tuple, kwargs: dict, target):
    """What `kernel[grid](*args, **kwargs)` compiles for `target`, bound as a launch binds it (Triton >= 3.7's
    triton.runtime.jit): each argument's type and specialization from the tensor or number itself (a pointer's
    16-byte alignment, an integer equal to 1 or divisible by 16: the `tt.divisibility` hints that let the compiler
    vectorize loads), the constexprs, and the compile options. (ASTSource, its options.)"""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    bind = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = bind(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return ASTSource(kernel, signature, constexprs, attrs), options


def global_reads(ptx: str) -> Counter:
    """The kernel's reads of global memory by instruction: `ld.global.b16` (one bfloat16 a thread), `ld.global.v4.b32`
    (16 bytes), and asynchronous copies to shared memory with their bytes (`cp.async.cg.shared.global 0x10`)."""
    reads = Counter()
    for line in ptx.splitlines():
        if found := re.search(r"\b(ld\.global[.\w]*|cp\.async\.\w+\.shared\.global)", line):
            size = line.split(",")[2].strip() if found[1].startswith("cp.async") else ""
            reads[f"{found[1]} {size}".strip()] += 1
    return reads


@compiled
@pytest.mark.parametrize("dtype, capability", [(torch.bfloat16, 80), (torch.bfloat16, 90), (torch.float32, 90)])
def test_the_kernels_compile_for_a100_and_h100(kernels, monkeypatch, require, dtype, capability):
    """Triton's GPU compiler needs no GPU: each kernel (the cache writes' too), bound to the very arguments its op
    launches it with as a launch
    binds them (the same specialization, alignment hints included, so the same kernel a GPU runs), compiles to a cubin
    for the A100 (sm_80) or the H100 (sm_90). The hints took: every tensor argument is 16-byte aligned, and the linear
    layer copies every element of its tiles to shared memory 16 bytes at a time (without the hints it loads one
    element a thread, `ld.global.b16`, and makes no such copy); in bfloat16 the linear layer and attention multiply
    on tensor cores."""
    require(triton_at_least("3.7"), "Triton 3.7 or newer: the test binds arguments with its launch's own binder")
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", capability, 32)
    for kernel, args, kwargs in launches(kernels, monkeypatch, dtype):
        source, options = launched_source(kernel, args, kwargs, target)
        pointers = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)]
        assert all(["tt.divisibility", 16] in source.attrs[(i,)] for i in pointers), (kernel, source.attrs)
        compiled_kernel = triton.compile(source, target=target, options=options.__dict__)
        assert compiled_kernel.asm["cubin"], kernel
        ptx = compiled_kernel.asm["ptx"]
        if kernel is kernels._linear_kernel:  # every element of x's and the weight's tiles, in every stage
            tiles = (kernels.LINEAR_BLOCK_M + kernels.LINEAR_BLOCK_N) * kernels.LINEAR_BLOCK_K * dtype.itemsize
            copies = kernels.LINEAR_STAGES * tiles // 16 // (32 * kernels.LINEAR_WARPS)  # per thread
            assert global_reads(ptx)["cp.async.cg.shared.global 0x10"] == copies, global_reads(ptx)
        if kernel in (kernels._linear_kernel, kernels._attention_kernel) and dtype == torch.bfloat16:
            assert ".f32.bf16.bf16" in ptx  # mma.sync (sm_80) or wgmma (sm_90) on bfloat16, accumulating in float32
        if dtype == torch.float32:
            assert "tf32" not in ptx  # float32 products in IEEE float32, as F.linear's default


def test_fake_kernels_give_output_shapes_without_running():
    """Meta tensors run no kernel, and need no triton: anywhere, in any process."""
    from adafuse.backend.cuda import kernels

    meta = torch.empty(5, 7, 96, device="meta")
    assert kernels.linear(meta, torch.empty(80, 96, device="meta")).shape == (5, 7, 80)
    assert kernels.rms_norm(meta, torch.empty(96, device="meta"), 1e-6).shape == meta.shape
    assert kernels.log_softmax(meta).shape == meta.shape
    q, k = torch.empty(6, 8, 64, device="meta"), torch.empty(20, 2, 64, device="meta")
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    assert kernels.varlen_attention(q, k, k, cu, cu, 0.125).shape == q.shape
    assert kernels.write_in_place(k, k, torch.empty(3, kernels.SLOT_FIELDS, dtype=torch.int64, device="meta")) is None


# --- linear ---------------------------------------------------------------------------------------------------------


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_row_alone_equals_it_among_others(kernels, dtype):
    """In 150 (three inner-dimension steps, the last partial) out 80 (two column tiles); 100 rows: two row tiles."""
    weight, bias = random(80, 150, dtype=dtype, seed=1), random(80, dtype=dtype, seed=2)
    check_rows(lambda x: kernels.linear(x, weight, bias), random(150, dtype=dtype, seed=3),
               random(100, 150, dtype=dtype, seed=4), COUNTS + (100,))  # fmt: skip


def follows_the_rows(monkeypatch, kernels, constant: str, alone: int, among: int, op):
    """`op` as a kernel whose block size follows the number of rows (requests) it gets, as cuBLAS's choice of kernel
    does: `constant` is `alone` for one row, `among` for more. The mutation the kernels rule out, made on purpose."""

    def mutant(x):
        monkeypatch.setattr(kernels, constant, alone if len(x) == 1 else among)
        return op(x)

    return mutant


@interpreted
@pytest.mark.parametrize("op", ["linear", "rms_norm", "log_softmax"])
def test_the_check_fails_a_kernel_whose_order_follows_the_row_count(kernels, monkeypatch, op):
    """The row checks above fail a kernel that sums a row in another order among others: a row's bits then depend
    on the rows beside it."""
    weight, bias = random(80, 150, seed=1), random(80, seed=2)
    norm_weight = 1.0 + 0.1 * random(1100, seed=1)
    mutants = {  # (the block constant, alone, among, the op, a probe row, filler rows)
        "linear": ("LINEAR_BLOCK_K", 64, 32, lambda x: kernels.linear(x, weight, bias), random(150, seed=3),
                   random(100, 150, seed=4)),
        "rms_norm": ("NORM_BLOCK", 1024, 512, lambda x: kernels.rms_norm(x, norm_weight, 1e-6), spread(1100, seed=2),
                     3 * random(64, 1100, seed=3)),
        "log_softmax": ("SOFTMAX_BLOCK", 2048, 1024, kernels.log_softmax, 4 * random(3000),
                        4 * random(64, 3000, seed=1)),
    }  # fmt: skip
    constant, alone, among, run, probe, filler = mutants[op]
    with pytest.raises(AssertionError, match="differs by up to"):
        check_rows(follows_the_rows(monkeypatch, kernels, constant, alone, among, run), probe, filler)


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_is_torchs_within_tolerance(kernels, dtype):
    x, weight, bias = random(2, 5, 150, dtype=dtype), random(80, 150, dtype=dtype, seed=1), random(80, dtype=dtype)
    torch.testing.assert_close(kernels.linear(x, weight, bias), F.linear(x, weight, bias), **TOLERANCE[dtype])
    torch.testing.assert_close(kernels.linear(x, weight), F.linear(x, weight), **TOLERANCE[dtype])


@interpreted
def test_stock_linear_differs_by_row_count_here_and_the_kernel_does_not(kernels):
    """The control: on this CPU torch's float32 F.linear (MKL) picks its kernel by the number of rows, so a row
    alone and the same row among 8 differ in their last bits; the kernel's do not. Where the stock multiply keeps a
    row's bits (another BLAS), there is nothing to show and the test says so."""
    x, weight = random(8, 96), random(80, 96, seed=1)
    if torch.equal(bits(F.linear(x[:1], weight)), bits(F.linear(x, weight)[:1])):
        pytest.skip("torch's F.linear keeps a row's bits among 8 rows on this machine: no control to show")
    assert_same_bits(kernels.linear(x[:1], weight), kernels.linear(x, weight)[:1], "kernel: row 0 alone vs among 8")


# --- RMSNorm ----------------------------------------------------------------------------------------------------------


def llama_rms_norm(x, weight, eps):
    """transformers' LlamaRMSNorm.forward (Mistral's is the same)."""
    hidden = x.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(x.dtype)


def gemma_rms_norm(x, weight, eps):
    """transformers' Gemma3RMSNorm.forward."""
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return (hidden * (1.0 + weight.float())).type_as(x)


FORMULAS = {  # name: (kernel arguments offset, cast_before_weight; reference; weight around 1 as each model's)
    "llama": ((0.0, True), llama_rms_norm, 1.0),
    "gemma3": ((1.0, False), gemma_rms_norm, 0.0),
}


@interpreted
@pytest.mark.parametrize("dtype, formula", [(torch.float32, "gemma3"), (torch.bfloat16, "llama")])
def test_rms_norm_row_alone_equals_it_among_others(kernels, dtype, formula):
    """Rows of 1100: two reduction steps of 1024, the last partial. (The formulas differ after the reduction, one
    element at a time: each dtype with one of them.)"""
    (offset, cast_first), _, around = FORMULAS[formula]
    weight = (around + 0.1 * random(1100, seed=1)).to(dtype)
    check_rows(lambda x: kernels.rms_norm(x, weight, 1e-6, offset, cast_first), spread(1100, dtype=dtype, seed=2),
               3 * random(64, 1100, dtype=dtype, seed=3))  # fmt: skip


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("formula", FORMULAS)
def test_rms_norm_is_hugging_faces_within_tolerance(kernels, dtype, formula):
    """Within tolerance, and in bfloat16 nearly every element bit for bit: the kernel rounds where the formula
    does (the other formula, one rounding more or less, differs in some tenth of the elements)."""
    (offset, cast_first), reference, around = FORMULAS[formula]
    x, weight = 3 * random(2, 3, 1100, dtype=dtype), (around + 0.1 * random(1100, seed=1)).to(dtype)
    got, expected = kernels.rms_norm(x, weight, 1e-6, offset, cast_first), reference(x, weight, 1e-6)
    torch.testing.assert_close(got, expected, **TOLERANCE[dtype])
    if dtype == torch.bfloat16:
        assert (bits(got) == bits(expected)).float().mean() > 0.99


# --- log-softmax ------------------------------------------------------------------------------------------------------


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_row_alone_equals_it_among_others(kernels, dtype):
    """Rows of 3000: two steps of 2048, the last partial."""
    check_rows(kernels.log_softmax, 4 * random(3000, dtype=dtype), 4 * random(64, 3000, dtype=dtype, seed=1))


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_is_torchs_within_tolerance(kernels, dtype):
    """float32 inside whatever the dtype, as the engine's upcast logits; masked entries (-inf) stay -inf."""
    x = 4 * random(3, 3000, dtype=dtype)
    x[1, ::7] = float("-inf")
    expected = torch.log_softmax(x.float(), dim=-1).to(dtype)
    torch.testing.assert_close(kernels.log_softmax(x), expected, **TOLERANCE[dtype])


# --- attention over requests packed end to end ----------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32


def request(len_q: int, len_k: int, dtype, seed: int, heads: tuple[int, int] = (HEADS, KV_HEADS)):
    """One request's queries (its last len_q positions) and its len_k keys and values."""
    return tuple(random(n, h, HEAD_DIM, dtype=dtype, seed=seed + i) for i, (n, h) in
                 enumerate([(len_q, heads[0]), (len_k, heads[1]), (len_k, heads[1])]))  # fmt: skip


def packed(requests):
    """The requests end to end: q, k, v and the cumulative lengths."""
    q, k, v = (torch.cat(parts) for parts in zip(*requests))

    def cumulative(lengths):
        return torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)

    return q, k, v, cumulative([r[0].shape[0] for r in requests]), cumulative([r[1].shape[0] for r in requests])


def unpacked(out, requests):
    return out.split([r[0].shape[0] for r in requests])


def reference_attention(q, k, v, scale, causal, window):
    """One request by torch's SDPA in float32, grouped-query heads repeated as transformers' repeat_kv does."""
    len_q, len_k = q.shape[0], k.shape[0]
    at = torch.arange(len_k - len_q, len_k)[:, None]  # each query's key position
    keys = torch.arange(len_k)[None, :]
    seen = torch.ones(len_q, len_k, dtype=torch.bool)
    if causal:
        seen &= keys <= at
    if window is not None:
        seen &= keys > at - window
    heads = q.shape[1]
    q, k, v = (t.float().repeat_interleave(heads // t.shape[1], 1).transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
    return F.scaled_dot_product_attention(q, k, v, seen, scale=scale).transpose(0, 1)


# (queries, keys) per request. (40, 100) with the window: rows 16 to 31 share a block whose first key block is
# wholly out of its last rows' windows (a query that has seen no key yet must stay at zero, not NaN)
SHAPES = [(1, 70), (3, 150), (2, 9), (5, 5), (1, 1), (4, 64), (2, 130), (40, 100)]
MODES = {"causal": (True, None), "window": (True, 24), "full": (False, None)}


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_varlen_attention_is_sdpa_per_request_within_tolerance(kernels, dtype, mode):
    causal, window = MODES[mode]
    requests = [request(len_q, len_k, dtype, seed=10 * i) for i, (len_q, len_k) in enumerate(SHAPES)]
    out = kernels.varlen_attention(*packed(requests), HEAD_DIM**-0.5, causal, window)
    for (q, k, v), got in zip(requests, unpacked(out, requests), strict=True):
        expected = reference_attention(q, k, v, HEAD_DIM**-0.5, causal, window).to(dtype)
        torch.testing.assert_close(got, expected, **TOLERANCE[dtype])


@interpreted
@pytest.mark.parametrize("dtype, mode", [(torch.float32, "causal"), (torch.bfloat16, "window")])
def test_varlen_attention_request_alone_equals_it_among_others(kernels, dtype, mode):
    """A request of 3 queries over 150 keys (three key blocks, the last partial), alone and among 1 to 64 requests
    of 1 to 3 queries over 1 to 80 keys; two query heads on one kv head (fewer programs for the interpreter)."""
    causal, window = MODES[mode]
    probe, filler = attention_requests(dtype)

    def attend(requests):
        out = kernels.varlen_attention(*packed(requests), HEAD_DIM**-0.5, causal, window, max_len_q=3)
        return unpacked(out, requests)

    check_requests(attend, probe, filler)


def attention_requests(dtype):
    """A request of 3 queries over 150 keys, and 64 others of 1 to 3 queries over 1 to 80 keys."""
    probe = request(3, 150, dtype, seed=1000, heads=(2, 1))
    lengths = torch.randint(1, 4, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    others = [request(len_q, len_q + 5 * i % 78, dtype, seed=10 * i, heads=(2, 1)) for i, len_q in enumerate(lengths)]
    return probe, others


def check_requests(attend, probe, filler) -> None:
    """attend(requests)'s output for `probe` alone equals it at every place among 1 to 64 requests, and each of
    EACH_ALONE requests' output among them equals that request's alone."""
    alone = attend([probe])[0]
    for n in COUNTS:
        requests = list(filler[:n])
        for i in places(n):
            requests[i] = probe
        outs = attend(requests)
        for i in places(n):
            assert_same_bits(alone, outs[i], f"request {i} of {n}")
    outs = attend(filler[:EACH_ALONE])
    for i, one in enumerate(filler[:EACH_ALONE]):
        assert_same_bits(attend([one])[0], outs[i], f"request {i} of {EACH_ALONE}, each alone")


@interpreted
def test_the_check_fails_an_attention_whose_key_blocks_follow_the_request_count(kernels, monkeypatch):
    """The request check above fails an attention that walks a request's keys in other blocks among others."""

    def attend(requests):
        out = kernels.varlen_attention(*packed(requests), HEAD_DIM**-0.5, True, None, max_len_q=3)
        return unpacked(out, requests)

    with pytest.raises(AssertionError, match="differs by up to"):
        check_requests(follows_the_rows(monkeypatch, kernels, "ATTENTION_BLOCK_N", 64, 32, attend),
                       *attention_requests(torch.float32))  # fmt: skip


@interpreted
@pytest.mark.parametrize("causal, window", [(True, None), (True, 4), (False, None)])
def test_a_querys_bits_do_not_depend_on_its_requests_query_count(kernels, causal, window):
    """The last query of a request of 5 queries over 132 keys equals it as the request's only query (same keys):
    its masked keys add exact zeros. With a window of 4, the 5 queries' block starts at key 64, wholly outside the
    last query's window (keys 128 to 131), where the query alone starts at key 128."""
    q, k, v = request(5, 132, torch.bfloat16, seed=7)
    cu_k = torch.tensor([0, 132], dtype=torch.int32)
    five = kernels.varlen_attention(q, k, v, torch.tensor([0, 5], dtype=torch.int32), cu_k, 0.2, causal, window)
    one = kernels.varlen_attention(q[-1:], k, v, torch.tensor([0, 1], dtype=torch.int32), cu_k, 0.2, causal, window)
    assert_same_bits(one[0], five[-1], "last query alone vs among 5")


def run_of(keys: torch.Tensor, values: torch.Tensor, row: int, length: int, start: int = 0) -> list[int]:
    """The run of a buffer's row (rows, kv_heads, capacity, d), as attention_in_place reads it: `length` positions
    from `start` where they lie."""
    return [keys[row, :, start].data_ptr(), values[row, :, start].data_ptr(), length, keys.stride(2), keys.stride(1)]


@interpreted
@pytest.mark.parametrize("dtype, mode", [(torch.float32, "causal"), (torch.bfloat16, "window")])
def test_keys_read_where_they_lie_give_the_bits_of_the_same_keys_packed(kernels, dtype, mode):
    """Requests whose keys lie in up to three runs of other buffers (a stored prompt prefix, a context's positions
    after it in a buffer with room after them, a fork row's own in a buffer of the fork's) get from
    attention_in_place the bits varlen_attention gives the same keys packed end to end: the CUDA backend's passes
    read a cache where it lies and copy nothing."""
    causal, window = MODES[mode]
    # (queries, prefix positions, context positions after them, the row's own)
    shapes = [(1, 0, 70, 0), (3, 20, 40, 5), (2, 0, 100, 30), (1, 0, 1, 1), (2, 33, 17, 9), (1, 64, 0, 2)]
    generator = torch.Generator().manual_seed(3)
    prefix = [random(1, KV_HEADS, 64, HEAD_DIM, dtype=dtype, seed=s) for s in (5, 6)]  # keys, values: 1 row
    context = [random(2, KV_HEADS, 128, HEAD_DIM, dtype=dtype, seed=s) for s in (1, 2)]  # keys, values: 2 rows
    own = [random(3, KV_HEADS, 48, HEAD_DIM, dtype=dtype, seed=s) for s in (3, 4)]
    runs, packed_k, packed_v, queries = [], [], [], []
    for i, (len_q, before, ctx, mine) in enumerate(shapes):
        row = int(torch.randint(2, (), generator=generator))
        parts = [(prefix, 0, 0, before), (context, row, before, ctx), (own, i % 3, 0, mine)]
        parts = [part for part in parts if part[3]]
        runs.append([run_of(*buffers, row, count, start) for buffers, row, start, count in parts])
        runs[-1] += [[0] * kernels.RUN_FIELDS] * (kernels.RUNS_PER - len(parts))
        for packed, b in ((packed_k, 0), (packed_v, 1)):
            held = [buffers[b][row, :, start : start + count] for buffers, row, start, count in parts]
            packed.append(torch.cat(held, dim=1).transpose(0, 1))
        queries.append(random(len_q, HEADS, HEAD_DIM, dtype=dtype, seed=20 + i))
    cumulative = [torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32) for lengths in
                  ([q.shape[0] for q in queries], [k.shape[0] for k in packed_k])]  # fmt: skip
    q = torch.cat(queries)
    in_place = kernels.attention_in_place(q, torch.tensor(runs), cumulative[0], KV_HEADS, 0.3, causal, window)
    packed = kernels.varlen_attention(q, torch.cat(packed_k), torch.cat(packed_v), *cumulative, 0.3, causal, window)
    assert_same_bits(packed, in_place, "in place vs packed")


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_pass_s_new_keys_and_values_are_written_where_the_slots_say(kernels, dtype):
    """write_in_place copies position slots[i, 0] of k and v (positions, kv_heads, d), zeros for -1, to the addresses
    slot i names, heads its stride apart, bit for bit: into buffers' rows at any position, and nothing else moves."""
    k, v = random(5, KV_HEADS, HEAD_DIM, dtype=dtype, seed=1), random(5, KV_HEADS, HEAD_DIM, dtype=dtype, seed=2)
    k = k.transpose(0, 1).contiguous().transpose(0, 1)  # positions apart by d, heads by positions * d: as a model's
    buffers = [random(2, KV_HEADS, 16, HEAD_DIM, dtype=dtype, seed=s) for s in (3, 4)]  # keys, values: 2 rows
    expected = [b.clone() for b in buffers]
    writes = [(0, 1, 7), (4, 0, 3), (-1, 1, 8), (2, 0, 15)]  # (source position, buffer row, position there)
    slots = []
    for source, row, at in writes:
        keys, values = (b[row, :, at] for b in buffers)  # (kv_heads, d), heads apart by the buffer's own stride
        slots.append([source, keys.data_ptr(), values.data_ptr(), keys.stride(0)])
        expected[0][row, :, at] = k[source] if source >= 0 else 0
        expected[1][row, :, at] = v[source] if source >= 0 else 0
    kernels.write_in_place(k, v, torch.tensor(slots))
    assert_same_bits(expected[0], buffers[0], "keys")
    assert_same_bits(expected[1], buffers[1], "values")
