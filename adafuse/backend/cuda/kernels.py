"""Batch-invariant kernels for the CUDA backend's passes: a row's bits (a request's, for attention) are the same
whatever else shares the call. Written in Triton, registered as torch ops (`adafuse::linear`, `adafuse::rms_norm`,
`adafuse::log_softmax`, `adafuse::varlen_attention`), for the engine's merged passes only: nothing here replaces
a stock aten op globally (vLLM's and SGLang's batch-invariant modes override `aten::mm` and friends for the whole
process; the engine calls these ops where it wants them).

What each kernel fixes (issue 50):

- `linear`: cuBLAS picks its GEMM kernel, split-K included, from the number of rows, so a row sums its inner
  dimension in another order alone than among others. Here every output tile is BLOCK_M x BLOCK_N, and every
  tile walks the inner dimension from 0 to K in steps of BLOCK_K, accumulating in float32 in one program: no
  split-K, and block sizes are constants that never depend on the number of rows.
- `rms_norm`: PyTorch's CUDA reduction chooses how many threads share a row from the number of rows. Here one
  program reduces one row, in chunks of NORM_BLOCK elements always summed in the same order.
- `log_softmax`: the same, for the max and the sum of exponentials (SOFTMAX_BLOCK-element chunks).
- `varlen_attention`: attention per request, for requests packed end to end (FlashAttention's variable-length
  layout). One program owns BLOCK_M query rows of one request and one head and walks that request's keys in
  BLOCK_N blocks counted from the request's own first key, with an online softmax in float32; the key sequence
  is never split across programs. One call per layer replaces the per-request loop.

Why a fixed order gives batch invariance: a float32 sum is exact up to the order of its additions. Each output
element here is computed by one program whose shape (block sizes, warps, stages) is a constant of the kernel and
whose reduction runs over the same blocks in the same order, so its instruction sequence, and so its bits, is a
function of its own row (its own request's keys) alone: other rows only fill other lanes of the same tiles, or
other programs. Attention goes one step further: a query's masked-out keys add exact zeros (p = 0, scale 1), so a
query's bits do not depend on how many queries its request has in the pass either (`varlen_attention`'s docstring).

What is verified where:

- on the CPU, under Triton's interpreter (tests/unit/test_cuda_kernels.py): the logic. A row (a request) alone gets
  the same bits as among 1 to 64 rows (and 100, for linear) at the first, a middle and the last place; every kernel
  agrees with torch (F.linear, Hugging Face's two RMSNorm formulas, torch.log_softmax, SDPA per request with its
  causal or sliding-window mask, grouped-query heads) within float32 and bfloat16 tolerances; in bfloat16 RMSNorm
  equals the formula it is asked for in over 99% of elements, bit for bit. The interpreter runs each program in
  numpy, which would compute `tl.dot` with numpy's matmul: the host's BLAS, whose bits for a row can depend on
  the row's place in the tile (OpenBLAS's Zen and Haswell kernels do, its SkylakeX kernel does not), so a test
  would judge the host's CPU rather than the kernel. There the kernels multiply by hand instead (`_dot`: every
  element summed over k from 0 up, in float32, whatever its place), a stand-in for the GPU's tile product with the
  property the kernels rely on, so the tests check the kernels' own logic (tiles, masks, the order of the steps)
  on any CPU. Its bfloat16 casts truncate, so there the kernels round by hand (`_cast`) to the GPU's
  round-to-nearest-even.
  TRITON_INTERPRET=1 must be set when the process starts: Triton wraps its own library when first imported, and
  torch imports it with torch._dynamo (custom ops do), so a process is interpreted or compiled throughout.
- on the CPU, by Triton's GPU compiler (which needs no GPU; the same test file, in the suite's compiled process):
  every kernel, with the arguments its op launches it with, compiles to a cubin for sm_80 (A100) and sm_90 (H100),
  and in bfloat16 linear and attention multiply on tensor cores (mma.sync / wgmma, float32 accumulation).
- only on a GPU: the bits of the compiled kernels on real hardware, tensor-core `tl.dot` included (the
  interpreter's numpy matmul says nothing about an MMA's order within a tile), which the backend probes at start
  for each op at the model's shapes (adafuse/backend/cuda/choice.py `decide`: a row alone against the same row
  among others, inputs whose sums round differently in another order), and their speed, which the full GPU check
  measures (`python -m tools.gpu_check`, with the same probes at the paper pair's shapes).

Caveats: float32, bfloat16 and float16 only; linear's x, weight and bias of one dtype, and attention's q, k and v
(RMSNorm's weight may be of another: it is read as float32); outputs in x's (q's) dtype. Rows are read with their
row stride, but a last dimension whose stride is not 1 is copied first. `varlen_attention` takes any head dim
(padded to a power of two, at least 16), cumulative lengths cu_q and cu_k of (requests + 1) entries on the device
(int32; int64 are converted), a request's queries as its last positions (len_k >= len_q), and a sliding window
only with causal attention. On the GPU a float32 `tl.dot` runs in IEEE float32 (no TF32), as F.linear does by
default. No autograd.
"""

from __future__ import annotations

import functools

import torch

# Triton where it is installed; where it is not, this module still imports and registers its ops (available() is
# False, and a launch raises). Registering a custom op imports torch._dynamo, which imports triton anyway.
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

# ---------------------------------------------------------------------------------------------------------------
# Block sizes: constants of the kernels, never functions of the number of rows (or requests) in a call.
LINEAR_BLOCK_M = 64  # rows per tile; fewer rows are zero-padded inside the tile (masked loads)
LINEAR_BLOCK_N = 64  # output features per tile
LINEAR_BLOCK_K = 64  # inner-dimension step: every tile sums K in these steps, from 0 up
LINEAR_WARPS, LINEAR_STAGES = 4, 3
NORM_BLOCK = 1024  # elements of a row per step of the RMSNorm reduction
SOFTMAX_BLOCK = 2048  # elements of a row per step of log-softmax's max and sum
ROW_WARPS = 4  # RMSNorm's and log-softmax's: with the block, the shape of the final sum's tree
ATTENTION_BLOCK_M = 16  # query rows per program: a decoding request has one to a few
ATTENTION_BLOCK_N = 64  # keys per step of the online softmax, counted from the request's first key
ATTENTION_WARPS, ATTENTION_STAGES = 4, 2
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# No FMA contraction: a multiply and an add round apart, as in torch's eager ops and in the interpreter (numpy), and
# a kernel's bits do not move with Triton's default (TRITON_DEFAULT_FP_FUSION, whose default Triton 3.10 changes).
# tl.dot's own multiply-adds are not contractions and are unaffected.
FP_FUSION = False
# ---------------------------------------------------------------------------------------------------------------


def _jit(**options):
    """triton.jit where triton is installed. It reads TRITON_INTERPRET as it wraps (here, at import), as it did
    for its own library when triton was first imported: a process runs interpreted or compiled throughout."""
    return (lambda fn: triton.jit(fn, **options)) if triton is not None else (lambda fn: fn)


def _require_triton() -> None:
    if triton is None:
        raise RuntimeError("the adafuse::* kernels need triton (pip install triton; adafuse.backend.cuda.available())")


@functools.cache
def interpreting() -> bool:
    """Whether these kernels run in Triton's interpreter (TRITON_INTERPRET=1 from the process's start): the only
    way they run on CPU tensors. Fixed when this module was imported."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_log_softmax_kernel, InterpretedFunction)


def _launchable(*tensors: torch.Tensor) -> None:
    """CUDA tensors launch compiled kernels; CPU tensors only under the interpreter (a test's way in)."""
    _require_triton()
    if tensors[0].device.type == "cpu" and not interpreting():
        raise RuntimeError(
            "adafuse::* ops run on CPU tensors only under Triton's interpreter (TRITON_INTERPRET=1), for tests"
        )
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"adafuse::* ops need every tensor on one device, got {sorted(map(str, devices))}")


def _check_dtype(x: torch.Tensor, *others: torch.Tensor) -> None:
    if x.dtype not in DTYPES:
        raise TypeError(f"adafuse::* kernels take {[str(d) for d in DTYPES]}, got {x.dtype}")
    for other in others:
        if other.dtype != x.dtype:
            raise TypeError(f"dtypes differ: {x.dtype} and {other.dtype}")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, last dim), its last dimension contiguous; a view where possible."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@_jit()
def _cast(x, LIKE, BY_HAND: tl.constexpr):
    """x (float32) in the element type of the pointer LIKE, rounded to nearest even. A GPU's cast does that;
    Triton's interpreter truncates to bfloat16 (numpy has no bfloat16), so there (BY_HAND) the rounding is done on
    the bits, to the same result: the CPU tests then see a GPU's roundings. Not taken on a GPU."""
    dtype = LIKE.dtype.element_ty
    y = x.to(dtype)
    if BY_HAND:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = bits + 0x7FFF + ((bits >> 16) & 1)  # round half to even on the 16 bits dropped
            y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return y


@_jit()
def _dot(a, b, acc, BY_HAND: tl.constexpr):
    """acc + a @ b, accumulated in float32. On a GPU, tl.dot: tensor cores for bfloat16 and float16, IEEE float32
    (not TF32, F.linear's default) for float32. Under the interpreter (BY_HAND) each element is its products summed
    over k from 0 up, in float32 (bfloat16 and float16 products are exact there), the same sequence of additions
    wherever its row sits in the tile: the interpreter's tl.dot would be numpy's matmul, whose bits hang on the
    host's BLAS (the module's docstring). Not taken on a GPU."""
    if BY_HAND:
        out = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    elif a.dtype == tl.float32:
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


# --- linear ------------------------------------------------------------------------------------------------------
# A plain grid, one program per output tile, not a persistent one: a persistent kernel's programs would take tiles
# in an order set by the number of tiles (so rows), which changes no bits but buys nothing for the engine's passes
# of tens of rows either; a plain grid keeps each tile's computation visibly independent of the launch. Axis 0 runs
# over row tiles, fastest, so the programs that share a weight tile run side by side and read it from L2 once.


# rows: not specialised (Triton would compile other kernels for 1 row and for multiples of 16 rows)
@_jit(do_not_specialize=["rows"])
def _linear_kernel(
    X, W, B, Y,
    rows, n_out, n_in,
    stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, BY_HAND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Y[m, n] = sum_k X[m, k] W[n, k] (+ B[n]): one (BLOCK_M, BLOCK_N) tile, K in BLOCK_K steps from 0 up."""
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, n_in, BLOCK_K):
        kk = start + k
        # rows past the last and columns past K load as zeros: they add exact zeros to nobody's sum
        x_ok = (m[:, None] < rows) & (kk[None, :] < n_in)
        w_ok = (n[None, :] < n_out) & (kk[:, None] < n_in)
        x = tl.load(X + m[:, None] * stride_xm + kk[None, :], mask=x_ok, other=0.0)  # (BLOCK_M, BLOCK_K)
        w = tl.load(W + n[None, :] * stride_wn + kk[:, None], mask=w_ok, other=0.0)  # (BLOCK_K, BLOCK_N)
        acc = _dot(x, w, acc, BY_HAND)
    if HAS_BIAS:
        acc += tl.load(B + n, mask=n < n_out, other=0.0).to(tl.float32)[None, :]
    out = _cast(acc, Y, BY_HAND)
    tl.store(Y + m[:, None] * stride_ym + n[None, :], out, mask=(m[:, None] < rows) & (n[None, :] < n_out))


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    _check_dtype(x, weight, *([bias] if bias is not None else []))
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} does not meet weight {tuple(weight.shape)} (out, in)")
    _launchable(x, weight, *([bias] if bias is not None else []))
    x2, w = _rows(x), _rows(weight)
    n_out, n_in = w.shape
    y = torch.empty(x2.shape[0], n_out, dtype=x.dtype, device=x.device)
    if y.numel():
        grid = (triton.cdiv(x2.shape[0], LINEAR_BLOCK_M), triton.cdiv(n_out, LINEAR_BLOCK_N))
        _linear_kernel[grid](
            x2, w, bias.contiguous() if bias is not None else w, y,
            x2.shape[0], n_out, n_in,
            x2.stride(0), w.stride(0), y.stride(0),
            HAS_BIAS=bias is not None, BY_HAND=interpreting(),
            BLOCK_M=LINEAR_BLOCK_M, BLOCK_N=LINEAR_BLOCK_N, BLOCK_K=LINEAR_BLOCK_K,
            num_warps=LINEAR_WARPS, num_stages=LINEAR_STAGES, enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
    return y.reshape(*x.shape[:-1], n_out)


# --- RMSNorm -----------------------------------------------------------------------------------------------------


@_jit()
def _rms_norm_kernel(
    X, W, Y, n, stride_x, stride_y, eps, offset,
    CAST_BEFORE_WEIGHT: tl.constexpr, BY_HAND: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One row: mean of squares in float32 over BLOCK-element steps (one partial sum per lane, lanes summed last),
    then the normalised row times (offset + weight) by one of the two Hugging Face formulas."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(X + row * stride_x + start + cols, mask=start + cols < n, other=0.0).to(tl.float32)
        squares += x * x
    inverse = tl.div_rn(1.0, tl.sqrt_rn(tl.sum(squares, axis=0) / n + eps))
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
        w = offset + tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
        normed = x * inverse
        if CAST_BEFORE_WEIGHT:  # Llama, Mistral: the normalised row in x's dtype, then times the weight
            normed = _cast(normed, Y, BY_HAND).to(tl.float32)
        tl.store(Y + row * stride_y + start + cols, _cast(normed * w, Y, BY_HAND), mask=mask)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, cast_before_weight: bool):
    _check_dtype(x)
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} for rows of {x.shape[-1]}")
    _launchable(x, weight)
    x2 = _rows(x)
    y = torch.empty_like(x2)
    if y.numel():
        _rms_norm_kernel[(x2.shape[0],)](
            x2, weight.contiguous(), y, x2.shape[1], x2.stride(0), y.stride(0), float(eps), float(offset),
            CAST_BEFORE_WEIGHT=cast_before_weight, BY_HAND=interpreting(),
            BLOCK=min(NORM_BLOCK, triton.next_power_of_2(x2.shape[1])),
            num_warps=ROW_WARPS, num_stages=1, enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
    return y.reshape(x.shape)


# --- log-softmax -------------------------------------------------------------------------------------------------


@_jit()
def _log_softmax_kernel(X, Y, n, stride_x, stride_y, BY_HAND: tl.constexpr, BLOCK: tl.constexpr):
    """One row in float32: its max, then the sum of exp(x - max) over BLOCK-element steps (one partial sum per lane,
    lanes summed last), then x - max - log(sum), as torch computes it."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    top = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
        top = tl.maximum(top, tl.where(mask, x, float("-inf")))
    peak = tl.max(top, axis=0)
    sums = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
        sums += tl.where(mask, tl.exp(x - peak), 0.0)
    log_sum = tl.log(tl.sum(sums, axis=0))
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_y + start + cols, _cast((x - peak) - log_sum, Y, BY_HAND), mask=mask)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    _check_dtype(x)
    _launchable(x)
    x2 = _rows(x)
    y = torch.empty_like(x2)
    if y.numel():
        block, by_hand = min(SOFTMAX_BLOCK, triton.next_power_of_2(x2.shape[1])), interpreting()
        _log_softmax_kernel[(x2.shape[0],)](
            x2, y, x2.shape[1], x2.stride(0), y.stride(0), BY_HAND=by_hand, BLOCK=block,
            num_warps=ROW_WARPS, num_stages=1, enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
    return y.reshape(x.shape)


# --- attention over requests packed end to end ---------------------------------------------------------------------


@_jit()
def _attention_kernel(
    Q, O, CU_Q, RUNS, scale, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
    BY_HAND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Queries [BLOCK_M * program 0, + BLOCK_M) of request program 2, head program 1, over that request's keys in
    BLOCK_N steps from its first key (float32 online softmax). Query i of a request with len_q queries and len_k
    keys stands at key position p = len_k - len_q + i and sees key j where j <= p (causal) and j > p - window.

    A request's keys and values are read where they lie, in up to three runs (`RUNS`, int64, (requests, RUNS_PER,
    5): per run the addresses of its first key and value, its length, and its strides between positions and between
    heads, in elements), one after another: a stored prompt prefix, a context's positions after it, a fork row's
    own."""
    request = tl.program_id(2)
    head = tl.program_id(1)
    first = tl.program_id(0) * BLOCK_M
    element = Q.dtype.element_ty
    run = RUNS + request.to(tl.int64) * 15
    k0, v0 = tl.load(run).to(tl.pointer_type(element)), tl.load(run + 1).to(tl.pointer_type(element))
    len0, t0, h0 = tl.load(run + 2), tl.load(run + 3), tl.load(run + 4)
    k1, v1 = tl.load(run + 5).to(tl.pointer_type(element)), tl.load(run + 6).to(tl.pointer_type(element))
    len1, t1, h1 = tl.load(run + 7), tl.load(run + 8), tl.load(run + 9)
    k2, v2 = tl.load(run + 10).to(tl.pointer_type(element)), tl.load(run + 11).to(tl.pointer_type(element))
    len2, t2, h2 = tl.load(run + 12), tl.load(run + 13), tl.load(run + 14)
    start1, start2 = len0, len0 + len1  # each run's first key among the request's
    q_start = tl.load(CU_Q + request).to(tl.int64)
    len_q = tl.load(CU_Q + request + 1) - tl.load(CU_Q + request)
    len_k = (len0 + len1 + len2).to(tl.int32)
    rows = first + tl.arange(0, BLOCK_M)
    at = len_k - len_q + rows  # each query's own key position
    dims = tl.arange(0, BLOCK_D)
    row_ok = (rows < len_q)[:, None] & (dims < HEAD_DIM)[None, :]
    q_at = Q + (q_start + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :]
    q = tl.load(q_at, mask=row_ok, other=0.0)  # (BLOCK_M, BLOCK_D)
    kv_head = head // GROUP  # grouped-query heads, as transformers' repeat_kv pairs them

    # Keys [lo, hi): all that any of this block's queries sees; a query's unseen keys in it are masked to exp = 0.
    # lo is a multiple of BLOCK_N counted from the request's first key, so blocks fall alike whoever shares the call.
    hi = len_k
    if CAUSAL:
        hi = tl.minimum(len_k, len_k - len_q + first + BLOCK_M)
    hi = tl.where(first < len_q, hi, 0)  # a program past the request's queries: nothing to do
    lo = 0
    if WINDOWED:
        lo = tl.maximum(len_k - len_q + first - window + 1, 0) // BLOCK_N * BLOCK_N

    top = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = (start + tl.arange(0, BLOCK_N)).to(tl.int64)
        in0 = cols < start1  # the key's run, each at its place after the runs before it
        in1 = (cols >= start1) & (cols < start2)
        in2 = (cols >= start2) & (cols < hi)
        dim_ok = dims < HEAD_DIM
        key0 = k0 + cols[None, :] * t0 + kv_head * h0 + dims[:, None]
        key1 = k1 + (cols - start1)[None, :] * t1 + kv_head * h1 + dims[:, None]
        key2 = k2 + (cols - start2)[None, :] * t2 + kv_head * h2 + dims[:, None]
        k = tl.where(
            in0[None, :],
            tl.load(key0, mask=in0[None, :] & dim_ok[:, None], other=0.0),
            tl.where(
                in1[None, :],
                tl.load(key1, mask=in1[None, :] & dim_ok[:, None], other=0.0),
                tl.load(key2, mask=in2[None, :] & dim_ok[:, None], other=0.0),
            ),
        )  # (BLOCK_D, BLOCK_N)
        scores = _dot(q, k, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), BY_HAND)
        seen = (cols < hi)[None, :] & (rows < len_q)[:, None]
        if CAUSAL:
            seen = seen & (cols[None, :] <= at[:, None])
        if WINDOWED:
            seen = seen & (cols[None, :] > at[:, None] - window)
        scores = tl.where(seen, scores * scale, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, axis=1))
        # a query that has seen no key yet keeps top = -inf: subtract 0 instead, so that exp gives 0, not NaN
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)
        p = tl.exp(scores - shift[:, None])
        rescale = tl.exp(top - shift)
        total = total * rescale + tl.sum(p, axis=1)
        value0 = v0 + cols[:, None] * t0 + kv_head * h0 + dims[None, :]
        value1 = v1 + (cols - start1)[:, None] * t1 + kv_head * h1 + dims[None, :]
        value2 = v2 + (cols - start2)[:, None] * t2 + kv_head * h2 + dims[None, :]
        v = tl.where(
            in0[:, None],
            tl.load(value0, mask=in0[:, None] & dim_ok[None, :], other=0.0),
            tl.where(
                in1[:, None],
                tl.load(value1, mask=in1[:, None] & dim_ok[None, :], other=0.0),
                tl.load(value2, mask=in2[:, None] & dim_ok[None, :], other=0.0),
            ),
        )  # (BLOCK_N, BLOCK_D)
        p = _cast(p, Q, BY_HAND)  # the weights in v's dtype, as FlashAttention multiplies them
        acc = acc * rescale[:, None]
        acc = _dot(p, v, acc, BY_HAND)
        top = new_top
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]  # a query that sees no key gets zeros
    o_at = O + (q_start + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :]
    tl.store(o_at, _cast(out, O, BY_HAND), mask=row_ok)


RUN_FIELDS = 5  # per run: key address, value address, length, stride between positions, between heads
RUNS_PER = 3  # runs a request's keys may lie in (`_attention_kernel`); an empty one is all zeros


def packed_runs(k: torch.Tensor, v: torch.Tensor, cu_k: torch.Tensor) -> torch.Tensor:
    """The runs of requests whose keys and values are packed end to end ((total, kv_heads, d) each, request b's at
    cu_k[b]:cu_k[b+1]): one run each, the others empty. Made on their device, without a sync."""
    starts, lengths = cu_k[:-1].to(torch.int64), (cu_k[1:] - cu_k[:-1]).to(torch.int64)
    step = k.stride(0) * k.element_size()
    first = torch.stack(
        [k.data_ptr() + starts * step, v.data_ptr() + starts * step, lengths,
         torch.full_like(lengths, k.stride(0)), torch.full_like(lengths, k.stride(1))], dim=1,
    )  # fmt: skip
    return torch.stack([first] + [torch.zeros_like(first)] * (RUNS_PER - 1), dim=1)


SLOT_FIELDS = 4  # per position written: its source in the pass (-1: zeros), the key's and value's address, head stride


@_jit()
def _write_kernel(
    K, V, SLOTS, stride_kt, stride_kh, stride_vt, stride_vh,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Position program 0 of the pass's new keys and values, K and V (positions, heads, d), copied to where slot
    program 0 says (`SLOTS`, int64, (slots, 4): the source position, -1 for zeros; the addresses of the key's and
    the value's first element; the stride between heads there, in elements)."""
    slot = SLOTS + tl.program_id(0).to(tl.int64) * 4
    source = tl.load(slot)
    key = tl.load(slot + 1).to(tl.pointer_type(K.dtype.element_ty))
    value = tl.load(slot + 2).to(tl.pointer_type(V.dtype.element_ty))
    head_stride = tl.load(slot + 3)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    inside = (heads < HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    read = inside & ((tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.int64) + source) >= 0)  # -1: zeros, nothing read
    k = tl.load(K + source * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=read, other=0.0)
    v = tl.load(V + source * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=read, other=0.0)
    tl.store(key + heads[:, None] * head_stride + dims[None, :], k, mask=inside)
    tl.store(value + heads[:, None] * head_stride + dims[None, :], v, mask=inside)


def _write_in_place(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    _check_dtype(k, v)
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"write_in_place: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if slots.dtype != torch.int64 or slots.dim() != 2 or slots.shape[1] != SLOT_FIELDS:
        raise ValueError(f"write_in_place: slots {tuple(slots.shape)} {slots.dtype}")
    _launchable(k, v, slots)
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    if slots.shape[0]:
        _write_kernel[(slots.shape[0],)](
            k, v, slots.contiguous(), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            HEADS=k.shape[1], HEAD_DIM=k.shape[2], BLOCK_H=triton.next_power_of_2(k.shape[1]),
            BLOCK_D=max(16, triton.next_power_of_2(k.shape[2])), num_warps=1, enable_fp_fusion=FP_FUSION,
        )  # fmt: skip


def _varlen_attention(q, k, v, cu_q, cu_k, scale, causal, window, max_len_q):
    _check_dtype(q, k, v)
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"varlen_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"varlen_attention: {q.shape[1]} query heads are not groups of {k.shape[1]} kv heads")
    if cu_q.shape != cu_k.shape or cu_q.dim() != 1 or cu_q.numel() < 1:
        raise ValueError(f"varlen_attention: cu_q {tuple(cu_q.shape)} and cu_k {tuple(cu_k.shape)}")
    _launchable(q, k, v, cu_q, cu_k)
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    return _run_attention(q, packed_runs(k, v, cu_k), cu_q, k.shape[1], scale, causal, window, max_len_q)


def _run_attention(q, runs, cu_q, kv_heads, scale, causal, window, max_len_q):
    """The kernel over the queries `q` of requests whose keys and values lie in `runs`."""
    if window is not None and (window < 1 or not causal):
        raise ValueError(f"attention: a window ({window}) must be >= 1 and goes with causal attention")
    if runs.dtype != torch.int64 or runs.shape != (cu_q.numel() - 1, RUNS_PER, RUN_FIELDS):
        raise ValueError(f"attention: runs {tuple(runs.shape)} {runs.dtype} for {cu_q.numel() - 1} requests")
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    requests = cu_q.numel() - 1
    # no sync to learn the longest request: at most every query belongs to one (programs past a request's end exit)
    longest = q.shape[0] if max_len_q is None else max_len_q
    if out.numel() and requests and longest:
        grid = (triton.cdiv(longest, ATTENTION_BLOCK_M), q.shape[1], requests)
        _attention_kernel[grid](
            q, out, cu_q.to(torch.int32), runs.contiguous(), float(scale), int(window or 0),
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            GROUP=q.shape[1] // kv_heads, HEAD_DIM=q.shape[2], CAUSAL=causal, WINDOWED=window is not None,
            BY_HAND=interpreting(),
            BLOCK_M=ATTENTION_BLOCK_M, BLOCK_N=ATTENTION_BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(q.shape[2])),
            num_warps=ATTENTION_WARPS, num_stages=ATTENTION_STAGES, enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
    return out


def _attention_in_place(q, runs, cu_q, kv_heads, scale, causal, window, max_len_q):
    _check_dtype(q)
    if q.shape[1] % kv_heads:
        raise ValueError(f"attention_in_place: {q.shape[1]} query heads are not groups of {kv_heads} kv heads")
    _launchable(q, runs, cu_q)
    return _run_attention(q, runs, cu_q, kv_heads, scale, causal, window, max_len_q)


# --- the torch ops -------------------------------------------------------------------------------------------------
# Each op: a CUDA kernel (compiled Triton), a CPU kernel (the same Triton kernel, interpreted: TRITON_INTERPRET=1
# only), and a fake kernel giving the output's shape (meta tensors, torch.compile's tracing). Registering needs
# neither a GPU nor triton.


def _op(name: str, fn, fake):
    op = torch.library.custom_op(f"adafuse::{name}", mutates_args=(), device_types="cuda")(fn)
    op.register_kernel("cpu", fn)
    op.register_fake(fake)
    return op


def _linear_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _linear(x, weight, bias)


def _rms_norm_impl(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0, cast_before_weight: bool = True
) -> torch.Tensor:
    return _rms_norm(x, weight, eps, offset, cast_before_weight)


def _log_softmax_impl(x: torch.Tensor) -> torch.Tensor:
    return _log_softmax(x)


def _varlen_attention_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    scale: float,
    causal: bool = True,
    window: int | None = None,
    max_len_q: int | None = None,
) -> torch.Tensor:
    return _varlen_attention(q, k, v, cu_q, cu_k, scale, causal, window, max_len_q)


def _attention_in_place_impl(
    q: torch.Tensor,
    runs: torch.Tensor,
    cu_q: torch.Tensor,
    kv_heads: int,
    scale: float,
    causal: bool = True,
    window: int | None = None,
    max_len_q: int | None = None,
) -> torch.Tensor:
    return _attention_in_place(q, runs, cu_q, kv_heads, scale, causal, window, max_len_q)


def _write_in_place_impl(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    _write_in_place(k, v, slots)


def _linear_fake(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _same_shape_fake(x, *args, **kwargs):
    return torch.empty_like(x)


_op("linear", _linear_impl, _linear_fake)
_op("rms_norm", _rms_norm_impl, _same_shape_fake)
_op("log_softmax", _log_softmax_impl, _same_shape_fake)
_op("varlen_attention", _varlen_attention_impl, _same_shape_fake)
_op("attention_in_place", _attention_in_place_impl, _same_shape_fake)
_op("write_in_place", _write_in_place_impl, lambda k, v, slots: None)


# --- what the backend calls ----------------------------------------------------------------------------------------
# A call on plain tensors goes to its launcher itself: the dispatcher's custom-op path costs the host 4 to 10 us a
# call (autograd's and dynamo's wrappers, the aliasing check), some 350 times in a pass at 32 layers, which is
# the host time a GPU waits on. A traced call (torch.compile), meta and other tensor subclasses (fake tensors) go
# through the registered op and its fake kernel.


def _call(op: str, launch, x: torch.Tensor, *args):
    if type(x) is torch.Tensor and not x.is_meta and not torch.compiler.is_compiling():
        return launch(x, *args)
    return getattr(torch.ops.adafuse, op)(x, *args)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) @ weight (out, in).T + bias (out,), accumulated in float32, in x's dtype: (..., out).
    A row's bits are the same whatever the number of rows and wherever the row sits."""
    return _call("linear", _linear, x, weight, bias)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0, cast_before_weight: bool = True
) -> torch.Tensor:
    """Per row of x (..., hidden): n = x / sqrt(mean(x^2) + eps) in float32, then, in x's dtype (..., hidden):

    - cast_before_weight=True, Llama and Mistral (`weight * x.to(dtype)` in transformers' LlamaRMSNorm):
      n cast to x's dtype first, then times (offset + weight), rounded once more (offset 0 for these models);
    - cast_before_weight=False, Gemma-3 (`(x * (1 + weight.float())).type_as(x)` in Gemma3RMSNorm, offset=1.0):
      n times (offset + weight) in float32, cast once.
    """
    return _call("rms_norm", _rms_norm, x, weight, eps, offset, cast_before_weight)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dimension, computed in float32, in x's dtype."""
    return _call("log_softmax", _log_softmax, x)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    scale: float,
    causal: bool = True,
    window: int | None = None,
    max_len_q: int | None = None,
) -> torch.Tensor:
    """Attention per request over requests packed end to end: q (total_q, q_heads, d), k and v (total_k, kv_heads,
    d), q_heads a multiple of kv_heads (query head h reads kv head h // (q_heads // kv_heads)); request b's queries
    are q[cu_q[b]:cu_q[b+1]], its keys k[cu_k[b]:cu_k[b+1]] (cu_*: (requests + 1,) cumulative lengths, int32 or
    int64, on q's device). A request's queries are its last positions: with causal, its query i sees keys up to
    len_k - len_q + i; with a window w too, only the last w of those (key j where position - w < j, as Gemma-3's
    sliding layers and transformers' sliding_window_overlay). scale multiplies q.k. Returns (total_q, q_heads, d).

    A query's bits depend on its request alone (its query, keys and values, and its key count), not on the other
    requests of the call, nor on how many queries its request has. max_len_q, an upper bound on any request's
    queries, only trims the launch grid (default total_q, which needs no host sync)."""
    return _call("varlen_attention", _varlen_attention, q, k, v, cu_q, cu_k, scale, causal, window, max_len_q)


def attention_in_place(
    q: torch.Tensor,
    runs: torch.Tensor,
    cu_q: torch.Tensor,
    kv_heads: int,
    scale: float,
    causal: bool = True,
    window: int | None = None,
    max_len_q: int | None = None,
) -> torch.Tensor:
    """`varlen_attention` over keys and values read where they lie: request b's in up to RUNS_PER runs, `runs[b]`
    (int64, (requests, RUNS_PER, RUN_FIELDS) on q's device: per run the address of its first key and of its first
    value, its length, and its strides between positions and between heads, in elements; each run's keys after the
    run's before it, an empty run all zeros), each (positions, kv_heads, d) as its strides say. Nothing is copied;
    the bits are those `varlen_attention` gives the same keys packed end to end. Every run must stay alive and
    unwritten until the kernel has read it."""
    return _call("attention_in_place", _attention_in_place, q, runs, cu_q, kv_heads, scale, causal, window, max_len_q)


def write_in_place(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """A pass's new keys and values, k and v (positions, kv_heads, d), written where they go in the caches, in one
    launch: slot i (`slots`, int64, (slots, SLOT_FIELDS) on k's device) takes position slots[i, 0] of k and v (-1:
    zeros, a row's right padding) to the addresses slots[i, 1] (key) and slots[i, 2] (value), each head
    slots[i, 3] elements after the one before. The values are copied as they are. Every address must stay alive
    until the launch has run."""
    _call("write_in_place", _write_in_place, k, v, slots)
