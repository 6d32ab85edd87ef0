"""Which kernels a model's passes use on its GPU, decided at start on the GPU itself, per op type.

A merged pass is exact where every op computes a row (a request, for attention) alone as it does among others.
For each op type of the model (its linear layers at the engine's row counts, its RMS norms, its attention) the
backend asks, on the device, with inputs built there (no weight goes to the host): does the stock kernel keep a
row's bits whatever the rows beside it, and does the batch-invariant kernel (adafuse/backend/cuda/kernels.py)?
The log-softmax needs no probe: it runs per read on the read's own logits, the same call alone or merged.

Two honest outcomes (`Choice`), never a per-row or per-tile loop on a GPU:

- invariant: for each op the stock kernel where it keeps the bits (cheaper), else the kernel, and attention in
  one variable-length call of the kernel (or, where no such call keeps the bits, once per request, exact still);
- batch-dependent, and said so: an op that neither keeps is named (`failing`); the model's passes then run the
  stock kernels, one call per layer, and a run records that its outputs depend on its batch size.

Verdicts are kept in a probe store named by the GPU's facts and the kernels' source (adafuse/backend/probe_store.py
`for_gpu`): the next process on the same GPU and software, another node of a cluster included, reads them instead of
probing. A probe that raises (no C compiler for Triton's launcher, an out-of-memory, a shape a kernel does not take)
gives no verdict: nothing is stored, its op, probe and reason go into the run's record (`errors`), and that kernel is
not used by this process. Torch's one-call attention is used only where its probe ran.
"""

import logging
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from adafuse.backend.cuda import available, kernels, layers
from adafuse.backend.probe_store import ProbeStore, Verdicts

log = logging.getLogger(__name__)

# The row counts a merged pass reaches (a GSM8K step at batch 32 packs thousands of positions), and the requests and
# cached keys one attention call sees (cuBLAS and FlashAttention pick kernels, split-K and split-KV by them). On a
# CPU tensor, where the kernels run interpreted for the tests, the small ones.
ROWS = {"cuda": (1, 2, 3, 4, 5, 8, 16, 31, 32, 64, 128, 256, 512, 1024, 2048, 4096), "cpu": (1, 2, 3, 5, 8, 32, 64)}
REQUESTS = (1, 2, 5, 16)
CACHED_KEYS = {"cuda": 1100, "cpu": 60}


@dataclass(frozen=True)
class Ops:
    """Which kernels a pass's layers use (adafuse/backend/cuda/layers.py reads it from the forward context)."""

    linear: bool  # the batch-invariant linear kernel (else cuBLAS)
    rms_norm: bool  # the batch-invariant RMSNorm kernel (else the model's own)
    attention: str  # "kernel": one variable-length call of the kernel; "stock": torch's; "per_request"


@dataclass
class Choice:
    """What one model's passes use on its GPU: exact (`exact`) and not (`stock`), and what was found."""

    exact: Ops
    stock: Ops
    failing: list[str]  # the op types neither kernel keeps invariant: exact passes are batch-dependent
    verdicts: dict = field(default_factory=dict)  # op type -> {"stock": keeps the bits, "kernel": keeps them}
    errors: list[dict] = field(default_factory=list)  # the probes that raised: {"op", "probe", "shape", "error"}
    toolchain: list[str] = field(default_factory=list)  # what Triton lacks here (adafuse/backend/cuda/toolchain.py)
    probe_seconds: float = 0.0

    @property
    def invariant(self) -> bool:
        return not self.failing

    def ops(self, exact: bool) -> Ops:
        return self.exact if exact and self.invariant else self.stock

    def describe(self, exact: bool) -> dict:
        """What a run records of the model's passes (config.yaml's runtime, metrics.json)."""
        ops = self.ops(exact)
        return {
            "backend": "cuda",
            "batch_invariant": exact and self.invariant,
            "failing": self.failing,
            "ops": {
                "linear": "kernel" if ops.linear else "stock",
                "rms_norm": "kernel" if ops.rms_norm else "stock",
                "log_softmax": "per_read",
                "attention": ops.attention,
            },
            "verdicts": self.verdicts,
            "probe_errors": self.errors,
            "toolchain": self.toolchain,
            "probe_seconds": round(self.probe_seconds, 3),
        }


def decide(
    model, device: torch.device, unknown_norms: list[str], stock_varlen, store: ProbeStore, toolchain: list[str]
) -> Choice:
    """Probe the model's op types on `device` (each verdict read from `store` where it was probed before) and
    choose its kernels (module docstring). `stock_varlen`: torch's one-call attention on this device, or None;
    `toolchain`: what Triton lacks here (where it lacks anything, our kernels are not probed)."""
    started = time.perf_counter()
    have_kernels = available() and not toolchain
    tables = {name: Verdicts(name, store) for name in ("linear", "rms_norm", "attention")}
    dtype = next(model.parameters()).dtype
    verdicts, errors = {}, []

    def probed(op: str, which: str, key: tuple, probe) -> bool | None:
        """The probe's verdict (the store's, where it ran before); None where it raised: no verdict, not stored."""
        try:
            return bool(tables[op].get_or_probe((which, *key), probe))
        except Exception as err:  # noqa: BLE001 - whatever stops a probe is recorded, and that kernel not used
            errors.append({"op": op, "probe": which, "shape": repr(key), "error": f"{type(err).__name__}: {err}"})
            log.warning("%s: the %s kernel's probe at %r raised %s: %s", op, which, key, type(err).__name__, err)
            return None

    def both(op: str, key: tuple, stock, kernel) -> dict:
        return {
            "stock": probed(op, "stock", key, stock),
            "kernel": probed(op, "kernel", key, kernel) if have_kernels else None,
        }

    linears = {}
    for module in model.modules():
        if isinstance(module, layers.KernelLinear):
            linears.setdefault((tuple(module.weight.shape), module.bias is not None), module)
    found = [
        both(
            "linear",
            (shape, bias, str(dtype)),
            lambda m=m: rows_keep_bits(lambda x: F.linear(x, m.weight, m.bias), m.in_features, m.weight),
            lambda m=m: rows_keep_bits(lambda x: kernels.linear(x, m.weight, m.bias), m.in_features, m.weight),
        )
        for (shape, bias), m in linears.items()
    ]
    verdicts["linear"] = _all(found)
    found = [
        both(
            "rms_norm",
            (type(n).__name__, tuple(n.weight.shape), str(dtype)),
            lambda n=n: rows_keep_bits(lambda x: super(type(n), n).forward(x), n.weight.shape[0], n.weight),
            lambda n=n: rows_keep_bits(lambda x: layers.norm_kernel(n, x), n.weight.shape[0], n.weight),
        )
        for n in layers.norms(model)
    ]
    verdicts["rms_norm"] = _all(found) if found else {"stock": True, "kernel": None}
    text = model.config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    shape = (heads, kv_heads, head_dim, str(dtype))
    like = next(model.parameters())

    def attention_probe(attend):
        return lambda: requests_keep_bits(attend, heads, kv_heads, head_dim, like)

    verdicts["attention"] = {
        "stock": probed("attention", "stock", shape, attention_probe(stock_varlen)) if stock_varlen else False,
        "kernel": probed("attention", "kernel", shape, attention_probe(kernel_attention)) if have_kernels else None,
    }
    failing = []
    linear = _pick(verdicts["linear"], "linear", failing)
    rms_norm = _pick(verdicts["rms_norm"], "rms_norm", failing)
    for name in unknown_norms:  # norms the kernel does not reproduce: exact only if the model's own keep the bits
        failing.append(f"rms_norm ({name}: no kernel of ours)")
    if verdicts["attention"]["kernel"]:
        attention = "kernel"
    elif verdicts["attention"]["stock"]:
        attention = "stock"
    else:
        attention = "per_request"  # the model's own attention once per request: the bits of each alone
    # torch's one call wherever its probe ran, whatever it found of the bits; where it raised, or there is none, the
    # model's own attention once per request
    stock_runs = verdicts["attention"]["stock"] is not None
    return Choice(
        exact=Ops(linear, rms_norm, attention),
        stock=Ops(False, False, "stock" if stock_varlen and stock_runs else "per_request"),
        failing=failing,
        verdicts=verdicts,
        errors=errors,
        toolchain=list(toolchain),
        probe_seconds=time.perf_counter() - started,
    )


def _all(found: list[dict]) -> dict:
    """Every weight shape's verdicts at once: an op type keeps the bits where it keeps them at every shape."""
    return {
        "stock": all(f["stock"] for f in found),
        "kernel": None if any(f["kernel"] is None for f in found) else all(f["kernel"] for f in found),
    }


def _pick(verdict: dict, op: str, failing: list[str]) -> bool:
    """Use the kernel? No where the stock one keeps the bits; yes where the kernel does; else `op` fails."""
    if verdict["stock"]:
        return False
    if verdict["kernel"]:
        return True
    failing.append(op)
    return False


def probe_rows(count: int, width: int, like: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Rows of mixed magnitudes (each element a normal draw times a power of two from 2^-6 to 2^6), built on the
    device: sums of such terms round differently in another order, so a changed order shows."""
    generator = torch.Generator(device=like.device).manual_seed(seed)
    x = torch.randn(count, width, generator=generator, device=like.device)
    scale = torch.randint(-6, 7, (count, width), generator=generator, device=like.device)
    return (x * torch.exp2(scale.float())).to(like.dtype)


@dataclass(frozen=True)
class Alone:
    """What a probe found of one op: the counts of rows (requests) in one call at which the first or the last (for
    attention also a middle one) got other bits than alone, and one call's milliseconds at each timed count."""

    differs_at: list[int]
    ms: dict[int, float] = field(default_factory=dict)

    @property
    def keeps_bits(self) -> bool:
        return not self.differs_at


def rows_alone(op, width: int, like: torch.Tensor, counts=None, timed=(), first=False) -> Alone:
    """Does `op` (rows, width) -> (rows, ...) give its first and its last row the bits each gets alone, among each
    of `counts` rows (default: ROWS on `like`'s device)? `first`: stop at the first count where not; `timed`: the
    counts to time one call at (`milliseconds`)."""
    counts = counts or ROWS.get(like.device.type, ROWS["cpu"])
    differs = []
    with torch.inference_mode():
        x = probe_rows(max((*counts, *timed)), width, like)
        alone = {i: op(x[i : i + 1]) for i in sorted({0, *(n - 1 for n in counts)})}
        for n in counts:
            out = op(x[:n])
            if not all(torch.equal(out[i : i + 1], alone[i]) for i in (0, n - 1)):
                differs.append(n)
                if first:
                    break
        return Alone(differs, {n: milliseconds(lambda n=n: op(x[:n])) for n in timed})


def rows_keep_bits(op, width: int, like: torch.Tensor) -> bool:
    """Does `op` keep its rows' bits among every count of ROWS rows (`rows_alone`)?"""
    return rows_alone(op, width, like, first=True).keeps_bits


def requests_alone(
    attention,
    heads: int,
    kv_heads: int,
    head_dim: int,
    like: torch.Tensor,
    counts=REQUESTS,
    timed=(),
    first=False,
    shapes=None,
) -> Alone:
    """Does `attention(q, k, v, cu_q, cu_k, scale, window, max_q, max_k)` give a request the bits it gets alone,
    first, in the middle and last among each of `counts` requests of other lengths? `shapes`: each request's
    (queries, cached keys), default a mix of a step of one query, a prompt's tail and rows of a fork after up to
    CACHED_KEYS keys. `first` and `timed` as in `rows_alone`."""
    longest = CACHED_KEYS.get(like.device.type, CACHED_KEYS["cpu"])
    most = max((*counts, *timed))
    shapes = shapes or [(1 + (7 * i) % 9, 3 + (13 * i * longest // 60) % longest) for i in range(most)]
    generator = torch.Generator(device=like.device).manual_seed(1)

    def draw(n: int, h: int) -> torch.Tensor:
        return torch.randn(n, h, head_dim, generator=generator, device=like.device).to(like.dtype)

    parts = [(draw(q, heads), draw(q + c, kv_heads), draw(q + c, kv_heads)) for q, c in shapes]
    scale = head_dim**-0.5

    def packed(which: list[int]) -> tuple[tuple, list[int]]:
        """The requests `which`, packed end to end: attention's arguments, and each request's queries."""
        qs, ks, vs = zip(*(parts[i] for i in which))
        cu_q = torch.tensor([0, *[len(q) for q in qs]], device=like.device).cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0, *[len(k) for k in ks]], device=like.device).cumsum(0).to(torch.int32)
        widths = [len(q) for q in qs]
        q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
        return (q, k, v, cu_q, cu_k, scale, None, max(widths), max(map(len, ks))), widths

    def call(which: list[int]) -> list[torch.Tensor]:
        args, widths = packed(which)
        return list(attention(*args).split(widths))

    differs = []
    with torch.inference_mode():
        alone = [call([i])[0] for i in range(max(counts))]
        for n in counts:
            together = call(list(range(n)))
            if not all(torch.equal(together[i], alone[i]) for i in {0, n // 2, n - 1}):
                differs.append(n)
                if first:
                    break
        calls = {n: packed(list(range(n)))[0] for n in timed}
        return Alone(differs, {n: milliseconds(lambda args=args: attention(*args)) for n, args in calls.items()})


def requests_keep_bits(attention, heads: int, kv_heads: int, head_dim: int, like: torch.Tensor) -> bool:
    """Does `attention` keep a request's bits among every count of REQUESTS requests (`requests_alone`)?"""
    return requests_alone(attention, heads, kv_heads, head_dim, like, first=True).keeps_bits


def milliseconds(call) -> float:
    """One `call()`'s median milliseconds (torch.utils.benchmark: repeated for 0.1 s, the GPU synchronised)."""
    return Timer("call()", globals={"call": call}).blocked_autorange(min_run_time=0.1).median * 1000


def kernel_attention(q, k, v, cu_q, cu_k, scale, window, max_q, max_k):
    """The batch-invariant kernel, causal, in `packed_attention`'s shape (adafuse/backend/cuda/attention.py)."""
    return kernels.varlen_attention(q, k, v, cu_q, cu_k, scale, True, window, max_q)
