"""The engine's host time per pass at the paper pair's real depth, where a GPU is bounded by it (tools/bench_decode.py
section 12, `--only host`).

On a GPU an 8B pass of a few dozen rows costs about what one row costs, so what bounds the ensemble there is the
host's time per pass. That time shows on a CPU with the paper's pair in shape at its real depth and head layout (32
layers, 32 query and 8 key-value heads) and a tiny width (hidden 64), where the arithmetic is negligible, as on a
GPU (tools/make_paper_pair.py writes the pair: real tokenizers and configs, seeded weights). In one run, float32:

1. `pass`: one plain transformers forward of one row after an NQ prompt (the unit every ratio is in), against one
   merged pass of 1, 8 and 32 requests of one token each after their NQ prompts, through the member's backend, each
   the median of `repeats`, all taking turns (`median_runs`); for each, the share of its time in its requests'
   attention, each on its own (the CPU's exactness: `attention_share`), and its host time (`host_ms`: all but the
   arithmetic, `Arithmetic`);
2. `decode`: AdaFuse exact at batch 8 against each member's transformers `generate()` at batch 1 on the same NQ
   prompts (tools/bench_overhead.py's runs), each with its host time, `rounds` times taking turns, the fastest
   round of each kept; AdaFuse with every pass on the engine's thread, as on a GPU, and side by side on the CPU's
   two threads, the CPU's default;
3. `copies`: the bytes of KV the engine copies per pass in an AdaFuse run at batch 8 (any op that reads a KV
   buffer's memory into other memory: concatenations, clones, gathers, a buffer grown or a row committed), and the
   bytes of new KV it writes, per pass;
4. `kernel_path`: the same merged passes and the same AdaFuse run through the CUDA backend's code
   (adafuse/backend/cuda/), its kernels stood in for by torch's ops on this CPU (`KernelStandIns`): every line of
   the host's work for a pass on a GPU, with the kernels' own time (the GPU's, there) counted apart as arithmetic,
   and the launches a pass makes; its decode against `generate()` timed beside it, before the CPU backend's pair is
   loaded (`kernel_path_decode`), with the host seconds of its passes' tables (`InPlace.of`: each read's claims in
   every layer and the addresses they give, the part of a pass's host work that grows with its reads).

At a tiny width the arithmetic that grows with a pass's rows is still not nothing on a CPU: the vocabulary
projection (128,256 x 64 for Llama-3) takes 1.2 ms for one row and 6 ms for eight here, where a GPU takes the
same time for both; so every figure also comes as host time, its wall time less the time inside the ops that do
the arithmetic (linear layers, attention, log-softmax), which is what a GPU's host would spend.
"""

import bisect
import inspect
import statistics
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from adafuse import Ensemble, ModelConfig, Request
from adafuse.backend import MERGED, PROMPT, Execution, Pass, Read
from adafuse.backend.cuda import kernels
from adafuse.backend.cuda.attention import InPlace
from adafuse.backend.cuda.backend import CudaBackend
from adafuse.backend.cuda.choice import Choice, Ops
from adafuse.backend.probe_store import ProbeStore
from adafuse.config import default_cache_dir
from adafuse.engine.loop import drive
from adafuse.loading.pretrained import load_pretrained
from adafuse.member import cache as kv
from adafuse.member.member import Member
from tools import make_paper_pair
from tools.bench_overhead import engine_run, generate_greedy

REAL_DEPTH = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
# the aten ops that put what they read into other memory (views and arithmetic read in place)
COPIES = {"cat", "stack", "clone", "copy_", "_to_copy", "index_select", "index", "gather", "repeat_interleave"}


def deep_pair(sizes: dict = REAL_DEPTH) -> Path:
    """The paper's pair in shape at `sizes`, built once under the cache (tools/make_paper_pair.py)."""
    tag = "-".join(f"{k.split('_')[-1]}{v}" for k, v in sizes.items())
    root = default_cache_dir() / "paper_pair_deep" / f"{make_paper_pair.cache_key()}-{tag}"
    if not make_paper_pair.built(root):
        root.mkdir(parents=True, exist_ok=True)
        for name in make_paper_pair.DEFAULT:
            make_paper_pair.build(name, root, sizes)
    return root


class Arithmetic:
    """Seconds spent inside the ops that do a pass's arithmetic (`OPS`: linear layers, attention, log-softmax),
    while active, by op. Each is timed around its call (a timer costs about a microsecond, counted as host time);
    the callers look each up at the call (`F.linear`, `torch.nn.functional.scaled_dot_product_attention`,
    `torch.log_softmax`), so the untouched model's and the engine's calls are both timed. Any other attribute that is
    called can be timed alike, a class's method too (`kernel_path_decode` times the pass tables, `InPlace.of`): each is
    put back as it was stored."""

    OPS = (
        (torch.nn.functional, "linear"),
        (torch.nn.functional, "scaled_dot_product_attention"),
        (torch, "log_softmax"),
    )

    def __init__(self, ops: tuple = OPS):
        self.seconds = dict.fromkeys((name for _, name in ops), 0.0)
        # (where, name, what a call runs, what `where` holds: a classmethod's descriptor rather than its bound method)
        self._originals = [(m, name, getattr(m, name), inspect.getattr_static(m, name)) for m, name in ops]

    def __enter__(self) -> "Arithmetic":
        for module, name, original, _ in self._originals:
            setattr(module, name, self._timed(name, original))
        return self

    def __exit__(self, *exc):
        for module, name, _, stored in self._originals:
            setattr(module, name, stored)

    def _timed(self, name, original):
        seconds = self.seconds

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - started

        return timed

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def timed_run(run, ops: tuple = Arithmetic.OPS) -> tuple[float, Arithmetic]:
    """Wall seconds of `run()`, and its arithmetic (the time inside `ops`)."""
    with Arithmetic(ops) as arithmetic:
        started = time.perf_counter()
        run()
        return time.perf_counter() - started, arithmetic


def median_runs(runs: dict, repeats: int, ops: tuple = Arithmetic.OPS) -> dict:
    """Each run's milliseconds, the median of `repeats` untimed calls, the runs taking turns (a slower minute on a
    shared machine slows them all alike); its host milliseconds (all but the arithmetic, the time inside `ops`) and
    its share in attention, from the shares of its timed call of median wall time of `repeats` more (the timers cost
    a pass of many calls more than one of few, so they stay out of the milliseconds)."""
    untimed = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            untimed[name].append(time.perf_counter() - started)
    timed = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            timed[name].append(timed_run(run, ops))
    measured = {}
    for name in runs:
        ms = 1000 * statistics.median(untimed[name])
        seconds, arithmetic = sorted(timed[name], key=lambda r: r[0])[repeats // 2]
        measured[name] = {
            "ms": ms,
            "host_ms": ms * (1 - arithmetic.total / seconds),
            "attention_share": arithmetic.seconds.get("scaled_dot_product_attention", 0.0) / seconds,
        }
    return measured


def plain_step(path: Path, prompt: str):
    """One transformers forward of one row after `prompt`, on the untouched model, as a call to time."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        cache = DynamicCache()
        logits = model(torch.tensor([tokenizer.encode(prompt)]), cache=cache, use_cache=True).logits
        step = logits[0, -1].argmax().view(1, 1)

    @torch.inference_mode()
    def run():
        model(step, cache=cache, use_cache=True)

    run()  # warm
    return run


def merged_step(member, prompts: list[str]):
    """One merged pass of one token after each prompt through the member's backend, as a call to time; its attention
    is each request's on its own."""
    slots = [member.clone() for _ in prompts]
    for slot, prompt in zip(slots, prompts):
        drive(slot.start(prompt))
    return one_token_pass(member.runner.backend, member.runner.prepared, [s.cache for s in slots])


def one_token_pass(backend, prepared, caches: list):
    """A merged pass of one token after each of `caches`, as a call to time (warmed once)."""

    def run():
        reads = tuple(Read(c, torch.tensor([[5]])) for c in caches)
        backend.execute([Pass(MERGED, prepared, reads)], Execution())

    run()
    return run


def prompt_context(backend, prepared, ids: list[int]):
    """The context cache of a prompt of `ids` read from nothing through `backend`."""
    read = Read(DynamicCache(), torch.tensor([ids]), last_only=True)
    backend.execute([Pass(PROMPT, prepared, (read,))], Execution())
    return kv.context_cache(read.cache, kv.KVLedger())


class KernelStandIns:
    """The CUDA backend's kernels (adafuse/backend/cuda/kernels.py) stood in for, while active, by torch's ops on this
    CPU, so that a pass runs every line of the host's work for it on a GPU and computes what the kernels compute,
    near enough to decode as they would: linear and RMSNorm by torch's, the cache write and attention read the KV
    buffers at the addresses the backend's tables give (`_at`: every KV buffer made while active is known by its
    address). Their bits are not the kernels' (tests/engine/test_cuda_backend.py checks those under Triton's
    interpreter). The stand-ins are where a GPU's launches are (`OPS`, for `Arithmetic`: their time is the GPU's
    there), and they count them (`launches`)."""

    OPS = tuple(
        (kernels, name)
        for name in ("_linear", "_rms_norm", "_write_in_place", "_attention_in_place", "_varlen_attention")
    )

    def __init__(self, reading_kv: bool = True):
        """`reading_kv=False`: the cache write does nothing and attention gives zeros, which is all a pass's host time
        needs, and leaves the host's caches to the host, as a GPU's kernels do (the KV that stand-ins read evicts
        the host's own data, and its time, though counted apart, slows the host code that follows)."""
        self.reading_kv = reading_kv
        self.launches = 0
        self._tensors: dict[int, weakref.ref] = {}  # a live KV buffer's storage address -> a tensor over it
        self._starts: list[int] | None = None  # their addresses, sorted (None: to sort again)

    def __enter__(self) -> "KernelStandIns":
        stand_ins = {
            "_linear": lambda x, weight, bias: torch._C._nn.linear(x, weight, bias),
            "_rms_norm": self._rms_norm,
            "_write_in_place": self._write if self.reading_kv else lambda k, v, slots: None,
            "_attention_in_place": self._attention if self.reading_kv else lambda q, *args: torch.zeros_like(q),
            "_varlen_attention": lambda q, *args: torch.zeros_like(q),  # the probes' only: every pass reads in place
        }
        self._originals = {name: getattr(kernels, name) for name in stand_ins}
        for name, stand_in in stand_ins.items():
            setattr(kernels, name, self._counted(stand_in))
        self._made = kv.KVBuffer.__init__
        if self.reading_kv:
            kv.KVBuffer.__init__ = self._registering(self._made)
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(kernels, name, original)
        kv.KVBuffer.__init__ = self._made

    def _counted(self, stand_in):
        def launch(*args):
            self.launches += 1
            with _disable_current_modes():  # what a kernel reads is no copy of the host's (`KVCopies`)
                return stand_in(*args)

        return launch

    def _registering(self, made):
        def init(buffer, keys, values, *args, **kwargs):
            made(buffer, keys, values, *args, **kwargs)
            for t in (keys, values):
                address, known = t.untyped_storage().data_ptr(), weakref.ref(t)
                self._tensors[address], self._starts = known, None
                weakref.finalize(buffer, self._forget, address, known)

        return init

    def _forget(self, address: int, known: weakref.ref) -> None:
        if self._tensors.get(address) is known:  # not a later buffer's at the same address
            del self._tensors[address]
            self._starts = None

    def _at(self, address: int, shape: tuple, strides: tuple) -> torch.Tensor:
        """The tensor of `shape` and `strides` (in elements) that starts at `address`, inside a KV buffer."""
        if self._starts is None:
            self._starts = sorted(self._tensors)
        start = self._starts[bisect.bisect_right(self._starts, address) - 1]
        tensor = self._tensors[start]()
        return tensor.as_strided(shape, strides, (address - start) // tensor.element_size())

    @staticmethod
    def _rms_norm(x, weight, eps, offset, cast_before_weight):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        return (normed.to(x.dtype) * (offset + weight) if cast_before_weight else normed * (offset + weight)).to(
            x.dtype
        )

    def _write(self, k, v, slots) -> None:
        for source, key_at, value_at, head_stride in slots.tolist():
            for new, at in ((k, key_at), (v, value_at)):
                place = self._at(at, tuple(new.shape[1:]), (head_stride, 1))
                place.copy_(new[source]) if source >= 0 else place.zero_()

    def _attention(self, q, runs, cu_q, kv_heads, scale, causal, window, max_len_q):
        out, bounds = torch.empty_like(q), cu_q.tolist()
        for b, request_runs in enumerate(runs.tolist()):
            keys, values = [], []
            for key_at, value_at, length, position_stride, head_stride in request_runs:
                if length:
                    shape, strides = (length, kv_heads, q.shape[2]), (position_stride, head_stride, 1)
                    keys.append(self._at(key_at, shape, strides))
                    values.append(self._at(value_at, shape, strides))
            k, v = (parts[0] if len(parts) == 1 else torch.cat(parts) for parts in (keys, values))
            queries = q[bounds[b] : bounds[b + 1]]
            seen = None  # a request's last query sees every key
            if len(queries) > 1 or window:
                position = torch.arange(len(k) - len(queries), len(k))[:, None]
                seen = torch.arange(len(k))[None, :] <= position
                if window:
                    seen &= torch.arange(len(k))[None, :] > position - window
            attended = torch._C._nn.scaled_dot_product_attention(
                queries.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), seen, scale=scale, enable_gqa=True
            )
            out[bounds[b] : bounds[b + 1]] = attended.transpose(0, 1)
        return out


EVERY_KERNEL = Choice(exact=Ops(True, True, "kernel"), stock=Ops(False, False, "stock"), failing=[])


def kernel_path_steps(path: Path, prompts: list[str], counts: tuple[int, ...], stand_ins: "KernelStandIns") -> dict:
    """Merged passes of `counts` requests of one token each after their prompts (`prompts`, cycled) through the CUDA
    backend's code on this CPU, its kernels stood in for (`stand_ins`, active), every op taken as kernel (as where the
    GPU's probes find the stock ones move a row's bits): per count, the pass as a call to time (with `stand_ins`
    active) and its launches."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    backend = CudaBackend("cpu", store=ProbeStore(None))
    prepared = backend.prepare(model)
    backend.choices[model] = EVERY_KERNEL  # as where a GPU's probes find the stock kernels move a row's bits
    steps = {}
    for count in counts:
        # a context of its own per request, as the engine's
        contexts = [prompt_context(backend, prepared, tokenizer.encode(p)) for p in (prompts * count)[:count]]
        run = one_token_pass(backend, prepared, contexts)
        stand_ins.launches = 0
        run()
        steps[count] = (run, stand_ins.launches)
    return steps


OPS_ON_A_GPU = Arithmetic.OPS + KernelStandIns.OPS


def kernel_path_ensemble(root: Path) -> Ensemble:
    """The pair as members whose passes run through the CUDA backend's code on this CPU, every op taken as kernel; to
    be run with `KernelStandIns` active (reading KV), made while they are."""
    backend = CudaBackend("cpu", store=ProbeStore(None))
    members = []
    for name in make_paper_pair.DEFAULT:
        tokenizer, model = load_pretrained(ModelConfig(name=name, path=str(root / name), dtype="float32"))
        members.append(Member(name, tokenizer, model, backend=backend))
        backend.choices[model] = EVERY_KERNEL
    return Ensemble(members)


class KVCopies(TorchDispatchMode):
    """Bytes of KV buffers' memory that ops copy elsewhere, and bytes of new KV written into buffers, while active."""

    def __init__(self):
        super().__init__()
        self.storages: set[int] = set()
        self.copied = self.written = 0
        made = kv.KVBuffer.__init__
        counter = self

        def recording(buffer, keys, values, *args, **kwargs):
            made(buffer, keys, values, *args, **kwargs)
            for t in (keys, values):
                ptr = t.untyped_storage().data_ptr()
                counter.storages.add(ptr)
                weakref.finalize(buffer, counter.storages.discard, ptr)

        self._made, self._recording = made, recording

    def watch(self, *caches) -> "KVCopies":
        """Count the buffers of caches made before this counter too (a context's, a fork's base and own, the stored
        prefix under one)."""
        for cache in caches:
            for layer in cache.layers:
                for buffer in (getattr(layer, name, None) for name in ("buffer", "base", "own")):
                    if buffer is None:
                        continue
                    prefix = [buffer.under[0]] if buffer.under else []  # the stored prefix it reads first
                    for held in (buffer, *prefix):
                        self.storages |= {t.untyped_storage().data_ptr() for t in (held.keys, held.values)}
        return self

    def __enter__(self):
        kv.KVBuffer.__init__ = self._recording
        return super().__enter__()

    def __exit__(self, *exc):
        kv.KVBuffer.__init__ = self._made
        return super().__exit__(*exc)

    def _in_kv(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.storages

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in COPIES:
            sources = args[1:] if name == "copy_" else args
            flat = [t for a in sources for t in (a if isinstance(a, list | tuple) else [a])]
            if any(self._in_kv(t) for t in flat):
                self.copied += (args[0] if name == "copy_" else out).nbytes
            elif name == "copy_" and self._in_kv(args[0]):
                self.written += args[0].nbytes
        return out


def stored_prefixes(ens: Ensemble) -> list:
    """The caches of the prompt prefixes the members keep (made before a counter starts, read by the runs it counts)."""
    return [cache for m in ens.members for _, cache in m.runner.prompts.entries]


def with_host_seconds(run, *args, ops: tuple = Arithmetic.OPS, **kwargs) -> dict:
    """`run(*args, **kwargs)`'s record (seconds, passes, ...) and its `host_seconds`: all but its arithmetic (the
    time inside `ops`)."""
    with Arithmetic(ops) as arithmetic:
        record = run(*args, **kwargs)
    return record | {"host_seconds": record["seconds"] - arithmetic.total}


COUNTS = (1, 8, 32)  # requests in the merged passes timed


def kernel_path_decode(root: Path, plain_models: list, requests: list[Request], rounds: int) -> dict:
    """AdaFuse exact at batch 8 through the CUDA backend's code (`KernelStandIns`) against each member's `generate()`
    at batch 1, `rounds` times taking turns, the fastest round of each kept, and the KV the host copies per pass.
    Run before the CPU backend's pair is loaded: a GPU node's process holds the GPU's models only, and with that pair
    loaded and decoding in between this path measured slower against `generate()` than without it (1.05x and 1.09x
    against 0.95x and 0.99x, the same code, in runs of their own)."""
    stand_ins = KernelStandIns()
    with stand_ins:
        ens = kernel_path_ensemble(root)
        engine_run(ens, requests[:2], "adafuse", {}, 8)  # warm: prefixes
    generates, runs = [], []
    for _ in range(rounds):
        generates.append([with_host_seconds(generate_greedy, t, m.eval(), requests) for t, m in plain_models])
        with stand_ins, Arithmetic(TABLES) as tables:
            stand_ins.launches = 0
            run = with_host_seconds(engine_run, ens, requests, "adafuse", {}, 8, ops=OPS_ON_A_GPU)
            runs.append(run | {"launches": stand_ins.launches, "tables_seconds": tables.total})
    generate = min(generates, key=lambda pair: sum(g["seconds"] for g in pair))
    run = min(runs, key=lambda r: r["seconds"])
    with stand_ins, KVCopies().watch(*stored_prefixes(ens)) as copies:
        counted = engine_run(ens, requests[:4], "adafuse", {}, 8)
    return {
        "generate": [{k: g[k] for k in KEPT if k in g} for g in generate],
        "adafuse_b8": {k: run[k] for k in (*KEPT, "launches", "tables_seconds")}
        | {"kv_bytes_copied_per_pass": copies.copied / max(counted["passes"], 1)},
        "adafuse_b8_host_over_summed_generate": run["host_seconds"] / sum(g["host_seconds"] for g in generate),
    }


TABLES = ((InPlace, "of"),)  # the CUDA backend's pass tables, made once a pass: timed apart, part of host time
KEPT = ("seconds", "host_seconds", "passes", "rows_per_pass", "ms_per_pass")  # of a decode's record


def compare_host(requests: list[Request], repeats: int = 7, sizes: dict = REAL_DEPTH, rounds: int = 2) -> dict:
    """The four parts of the module docstring, on the first model of the pair for the passes; every pass timed taking
    turns with the others (`median_runs`), every decode `rounds` times, taking turns, its least disturbed round
    kept (the fewest seconds); the kernel path's decode first, before the CPU backend's pair is loaded
    (`kernel_path_decode`)."""
    root = deep_pair(sizes)
    names = make_paper_pair.DEFAULT
    plain_models = [
        (AutoTokenizer.from_pretrained(root / n), AutoModelForCausalLM.from_pretrained(root / n, dtype=torch.float32))
        for n in names
    ]
    kernel_decode = kernel_path_decode(root, plain_models, requests, rounds)
    ens = Ensemble.from_config([ModelConfig(name=n, path=str(root / n), dtype="float32") for n in names])
    prompts = [r.prompt for r in requests]
    with KernelStandIns(reading_kv=False) as stand_ins:  # only the CUDA backend's code calls its kernels
        steps = {"plain": plain_step(root / names[0], prompts[0])}
        steps |= {("cpu", n): merged_step(ens.members[0], (prompts * n)[:n]) for n in COUNTS}
        kernel_steps = kernel_path_steps(root / names[0], prompts, COUNTS, stand_ins)
        steps |= {("kernel", n): run for n, (run, _) in kernel_steps.items()}
        timed = median_runs(steps, repeats, OPS_ON_A_GPU)
    plain = timed["plain"]
    passes = [{"requests": n} | timed["cpu", n] for n in COUNTS]
    kernel_passes = [{"requests": n, "launches": kernel_steps[n][1]} | timed["kernel", n] for n in COUNTS]

    engine_run(ens, requests[:2], "adafuse", {}, 8)  # warm: probes, prefixes
    runs = {"generate": [], "on_thread": [], "side_by_side": []}
    for _ in range(rounds):
        runs["generate"].append([with_host_seconds(generate_greedy, t, m.eval(), requests) for t, m in plain_models])
        # every pass on the engine's thread, as on a GPU; and side by side, the CPU's default (its two threads'
        # arithmetic overlaps, so it has no host time to tell)
        runs["on_thread"].append(with_host_seconds(engine_run, ens, requests, "adafuse", {}, 8, side_by_side=False))
        runs["side_by_side"].append(engine_run(ens, requests, "adafuse", {}, 8))
    generate = min(runs["generate"], key=lambda pair: sum(g["seconds"] for g in pair))
    on_thread, side_by_side = (min(runs[k], key=lambda r: r["seconds"]) for k in ("on_thread", "side_by_side"))
    with KVCopies().watch(*stored_prefixes(ens)) as copies:
        counted = engine_run(ens, requests[:4], "adafuse", {}, 8)
    summed = sum(g["seconds"] for g in generate)
    summed_host = sum(g["host_seconds"] for g in generate)
    return {
        "sizes": sizes,
        "prompts": len(requests),
        "budget": requests[0].max_new_tokens,
        "rounds": rounds,
        "pass": {
            "plain_forward": plain,
            "merged": passes,
            "ratios": {f"merged_{p['requests']}_over_plain": p["ms"] / plain["ms"] for p in passes},
            "host_ratios": {f"merged_{p['requests']}_over_plain": p["host_ms"] / plain["host_ms"] for p in passes},
        },
        "decode": {
            "generate": [{k: g[k] for k in KEPT if k in g} for g in generate],
            "adafuse_b8": {k: on_thread[k] for k in KEPT},
            "adafuse_b8_side_by_side": {k: side_by_side[k] for k in KEPT if k != "host_seconds"},
            "ratios": {
                "adafuse_b8_over_summed_generate": on_thread["seconds"] / summed,
                "adafuse_b8_side_by_side_over_summed_generate": side_by_side["seconds"] / summed,
            },
            "host_ratios": {"adafuse_b8_over_summed_generate": on_thread["host_seconds"] / summed_host},
        },
        "kernel_path": {
            "merged": kernel_passes,
            "host_ratios": {
                f"merged_{p['requests']}_over_plain": p["host_ms"] / plain["host_ms"] for p in kernel_passes
            },
        }
        | kernel_decode,
        "copies": {
            "passes": counted["passes"],
            "kv_bytes_copied_per_pass": copies.copied / max(counted["passes"], 1),
            "kv_bytes_written_per_pass": copies.written / max(counted["passes"], 1),
        },
    }
