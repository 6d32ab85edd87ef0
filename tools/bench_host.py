"""The engine's host time per pass at the paper pair's real depth, where a GPU is bounded by it (tools/bench_decode.py
section 12, `--only host`).

On a GPU an 8B pass of a few dozen rows costs about what one row costs, so what bounds the ensemble there is the
host's time per pass. That time shows on a CPU with the paper's pair in shape at its real depth and head layout (32
layers, 32 query and 8 key-value heads) and a tiny width (hidden 64), where the arithmetic is negligible, as on a
GPU (tools/make_paper_pair.py writes the pair: real tokenizers and configs, seeded weights). In one run, float32:

1. `pass`: one plain transformers forward of one row after an NQ prompt (the unit every ratio is in), against one
   merged pass of 1, 8 and 32 requests of one token each after their NQ prompts, through the member's backend, each
   the median of `repeats`; for each, the share of its time in its requests' attention, each on its own (the CPU's
   exactness: `attention_share`), and its host time (`host_ms`: all but the arithmetic, `Arithmetic`);
2. `decode`: AdaFuse exact at batch 8 against each member's transformers `generate()` at batch 1 on the same NQ
   prompts (tools/bench_overhead.py's runs), each with its host time; AdaFuse with every pass on the engine's
   thread, as on a GPU, and side by side on the CPU's two threads, the CPU's default;
3. `copies`: the bytes of KV the engine copies per pass in an AdaFuse run at batch 8 (any op that reads a KV
   buffer's memory into other memory: concatenations, clones, gathers, a buffer grown or a row committed), and the
   bytes of new KV it writes, per pass.

At a tiny width the arithmetic that grows with a pass's rows is still not nothing on a CPU: the vocabulary
projection (128,256 x 64 for Llama-3) takes 1.2 ms for one row and 6 ms for eight here, where a GPU takes the
same time for both; so every figure also comes as host time, its wall time less the time inside the ops that do
the arithmetic (linear layers, attention, log-softmax), which is what a GPU's host would spend.
"""

import statistics
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from adafuse import Ensemble, ModelConfig, Request
from adafuse.backend import MERGED, Execution, Pass, Read
from adafuse.config import default_cache_dir
from adafuse.engine.loop import drive
from adafuse.member import cache as kv
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
    `torch.log_softmax`), so the untouched model's and the engine's calls are both timed."""

    OPS = (
        (torch.nn.functional, "linear"),
        (torch.nn.functional, "scaled_dot_product_attention"),
        (torch, "log_softmax"),
    )

    def __init__(self):
        self.seconds = dict.fromkeys((name for _, name in self.OPS), 0.0)
        self._originals = [(module, name, getattr(module, name)) for module, name in self.OPS]

    def __enter__(self) -> "Arithmetic":
        for module, name, original in self._originals:
            setattr(module, name, self._timed(name, original))
        return self

    def __exit__(self, *exc):
        for module, name, original in self._originals:
            setattr(module, name, original)

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


def timed_run(run) -> tuple[float, Arithmetic]:
    """Wall seconds of `run()`, and its arithmetic."""
    with Arithmetic() as arithmetic:
        started = time.perf_counter()
        run()
        return time.perf_counter() - started, arithmetic


def median_run(run, repeats: int) -> dict:
    """`run()`'s milliseconds, the median of `repeats` untimed runs; its host milliseconds (all but the arithmetic)
    and its share in attention, from the shares of the timed run of median wall time of `repeats` more (the timers
    cost a pass of many calls more than one of few, so they stay out of the milliseconds)."""
    untimed = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        untimed.append(time.perf_counter() - started)
    ms = 1000 * statistics.median(untimed)
    timed = sorted((timed_run(run) for _ in range(repeats)), key=lambda r: r[0])
    seconds, arithmetic = timed[len(timed) // 2]
    return {
        "ms": ms,
        "host_ms": ms * (1 - arithmetic.total / seconds),
        "attention_share": arithmetic.seconds["scaled_dot_product_attention"] / seconds,
    }


def plain_forward(path: Path, prompt: str, repeats: int) -> dict:
    """One transformers forward of one row after `prompt`, on the untouched model (`median_run`)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        cache = DynamicCache()
        logits = model(torch.tensor([tokenizer.encode(prompt)]), cache=cache, use_cache=True).logits
        step = logits[0, -1].argmax().view(1, 1)
        model(step, cache=cache, use_cache=True)  # warm
        return median_run(lambda: model(step, cache=cache, use_cache=True), repeats)


def merged_pass(member, prompts: list[str], repeats: int) -> dict:
    """One merged pass of one token after each prompt (`median_run`); its attention is each request's on its own."""
    slots = [member.clone() for _ in prompts]
    for slot, prompt in zip(slots, prompts):
        drive(slot.start(prompt))
    backend, prepared = member.runner.backend, member.runner.prepared

    def run():
        reads = tuple(Read(s.cache, torch.tensor([[5]])) for s in slots)
        backend.execute([Pass(MERGED, prepared, reads)], Execution())

    run()
    return {"requests": len(prompts)} | median_run(run, repeats)


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
        """Count the buffers of caches made before this counter too (a context's, a fork's base and own)."""
        for cache in caches:
            for layer in cache.layers:
                for buffer in (getattr(layer, name, None) for name in ("buffer", "base", "own")):
                    if buffer is not None:
                        self.storages |= {t.untyped_storage().data_ptr() for t in (buffer.keys, buffer.values)}
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


def with_host_seconds(run, *args, **kwargs) -> dict:
    """`run(*args, **kwargs)`'s record (seconds, passes, ...) and its `host_seconds`: all but its arithmetic."""
    with Arithmetic() as arithmetic:
        record = run(*args, **kwargs)
    return record | {"host_seconds": record["seconds"] - arithmetic.total}


def compare_host(requests: list[Request], repeats: int = 7, sizes: dict = REAL_DEPTH) -> dict:
    """The three parts of the module docstring, on the first model of the pair for `pass`."""
    root = deep_pair(sizes)
    names = make_paper_pair.DEFAULT
    ens = Ensemble.from_config([ModelConfig(name=n, path=str(root / n), dtype="float32") for n in names])
    prompts = [r.prompt for r in requests]
    plain = plain_forward(root / names[0], prompts[0], repeats)
    passes = [merged_pass(ens.members[0], (prompts * n)[:n], repeats) for n in (1, 8, 32)]
    engine_run(ens, requests[:2], "adafuse", {}, 8)  # warm: probes, prefixes
    plain_models = [
        (AutoTokenizer.from_pretrained(root / n), AutoModelForCausalLM.from_pretrained(root / n, dtype=torch.float32))
        for n in names
    ]
    generate = [with_host_seconds(generate_greedy, t, m.eval(), requests) for t, m in plain_models]
    # every pass on the engine's thread, as on a GPU; and side by side, the CPU's default (its two threads' arithmetic
    # overlaps, so it has no host time to tell)
    on_thread = with_host_seconds(engine_run, ens, requests, "adafuse", {}, 8, side_by_side=False)
    side_by_side = engine_run(ens, requests, "adafuse", {}, 8)
    with KVCopies() as copies:
        counted = engine_run(ens, requests[:4], "adafuse", {}, 8)
    summed = sum(g["seconds"] for g in generate)
    summed_host = sum(g["host_seconds"] for g in generate)
    kept = ("seconds", "host_seconds", "passes", "rows_per_pass", "ms_per_pass")
    return {
        "sizes": sizes,
        "prompts": len(requests),
        "budget": requests[0].max_new_tokens,
        "pass": {
            "plain_forward": plain,
            "merged": passes,
            "ratios": {f"merged_{p['requests']}_over_plain": p["ms"] / plain["ms"] for p in passes},
            "host_ratios": {f"merged_{p['requests']}_over_plain": p["host_ms"] / plain["host_ms"] for p in passes},
        },
        "decode": {
            "generate": [{k: g[k] for k in kept if k in g} for g in generate],
            "adafuse_b8": {k: on_thread[k] for k in kept},
            "adafuse_b8_side_by_side": {k: side_by_side[k] for k in kept if k != "host_seconds"},
            "ratios": {
                "adafuse_b8_over_summed_generate": on_thread["seconds"] / summed,
                "adafuse_b8_side_by_side_over_summed_generate": side_by_side["seconds"] / summed,
            },
            "host_ratios": {"adafuse_b8_over_summed_generate": on_thread["host_seconds"] / summed_host},
        },
        "copies": {
            "passes": counted["passes"],
            "kv_bytes_copied_per_pass": copies.copied / max(counted["passes"], 1),
            "kv_bytes_written_per_pass": copies.written / max(counted["passes"], 1),
        },
    }
