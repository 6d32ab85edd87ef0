"""The GPU check's child process: the jobs tools/gpu_full.py gives it, one after another in this process, each
written to RECORDS as one JSON line when it starts and one when it ends, so that the parent, which stops this
process at its deadline, keeps every job that ended and knows which one it cut.

    python -m tools.gpu_runs PLAN.json RECORDS.jsonl

PLAN.json is {"deadline": epoch seconds, "jobs": [{"kind": ..., "name": ..., ...}]}; a job not started by the
deadline is left to the parent to record. The kinds:

- `build`: the paper's pair written to local disk (tools/make_paper_pair.py `build`) at the job's sizes, its
  seeded random bfloat16 weights made on the job's device and saved in the hub's shards;
- `ops`: per op type of the pair (read from its config.json files), on the device in bfloat16, whether a row (a
  request, for attention) computed among others gets the bits it gets alone, for the stock kernel and for the
  CUDA backend's own (adafuse/backend/cuda/kernels.py), at each row count (request count) of the job;
- `run`: `run.py` with the job's overrides, through Hydra, in this process, as a `python run.py -m` sweep runs
  its jobs: the runner keeps the models it loaded for the next run (eval/runner.py `load_ensemble`), so a run
  after the first pays no load. Optionally under torch.profiler, for the host/GPU split;
- `generate`: one member's transformers `generate()` at batch 1, on the model as transformers loads it from the
  pair's folder (what a user would run instead), over the task's prompts as run.py renders them.

Every job's GPU memory is read here, per visible GPU: torch's allocator counts per process, so only the process
that ran a job can say what the job took (its peak statistics reset before it, read after it).
"""

import argparse
import gc
import importlib
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

LAUNCHES = ("cudaLaunch", "cuLaunch")  # the CUDA runtime's kernel launches and the driver's (Triton's)
TOP = 8  # host ops and kernels listed by time in a profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plan", type=Path)
    parser.add_argument("records", type=Path)
    args = parser.parse_args()
    plan = json.loads(args.plan.read_text())
    for job in plan["jobs"]:
        if time.time() > plan["deadline"]:
            return
        write(args.records, {"event": "start", "name": job["name"]})
        peaks = GpuPeaks()
        started = time.perf_counter()
        try:
            record = JOBS[job["kind"]](job)
        except Exception as err:  # recorded; the next job still runs
            record = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        record |= {"wall_seconds": time.perf_counter() - started, "memory": peaks.read()}
        write(args.records, {"event": "end", "name": job["name"], **record})
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # what a job let go (a bare model after `generate`) is not the next one's


def write(records: Path, line: dict) -> None:
    with open(records, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


class GpuPeaks:
    """Each visible GPU's memory over a job: allocated at its start, and the most allocated and reserved in it
    (torch's allocator, this process's tensors); {} on a machine without a GPU."""

    def __init__(self):
        self.devices = range(torch.cuda.device_count()) if torch.cuda.is_available() else range(0)
        self.start = {}
        for d in self.devices:
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
            self.start[d] = torch.cuda.memory_allocated(d)

    def read(self) -> dict:
        figures = {}
        for d in self.devices:
            torch.cuda.synchronize(d)
            figures[f"cuda:{d}"] = {
                "start_gb": self.start[d] / 2**30,
                "peak_gb": torch.cuda.max_memory_allocated(d) / 2**30,
                "peak_reserved_gb": torch.cuda.max_memory_reserved(d) / 2**30,
            }
        return figures


# ---- build ------------------------------------------------------------------------------------------------


def build(job: dict) -> dict:
    """Each model of the pair written to job["out"]/<name>; per model its seconds, weight files and parameters."""
    from safetensors import safe_open

    from tools import make_paper_pair

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    models = {}
    for name in job["names"]:
        started = time.perf_counter()
        folder = make_paper_pair.build(name, out, job["sizes"], job["device"], torch.bfloat16, job["shard_bytes"])
        files = sorted(folder.glob("*.safetensors"))
        parameters = 0
        for file in files:
            with safe_open(file, "pt") as weights:
                parameters += sum(math.prod(weights.get_slice(k).get_shape()) for k in weights.keys())
        config = json.loads((folder / "config.json").read_text())
        models[name] = {
            "seconds": time.perf_counter() - started,
            "parameters": parameters,
            "weights_gb": sum(f.stat().st_size for f in files) / 2**30,
            "files": len(files),
            "layers": config["num_hidden_layers"],
            "hidden": config["hidden_size"],
            "vocab": config["vocab_size"],
        }
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"folder": str(out), "models": models}


# ---- ops --------------------------------------------------------------------------------------------------


def ops(job: dict) -> dict:
    """Per op type, at each of the pair's shapes: {"stock": verdict, "kernel": verdict, or None where the kernels
    cannot run here}, each verdict whether the first and the last row among n (the first, a middle and the last
    request, for attention) get the bits each gets alone, at every n of the job's counts. The inputs are the
    engine's own probe rows (adafuse/backend/cuda/choice.py `probe_rows`: mixed magnitudes, whose sums round
    differently in another order)."""
    from adafuse.backend.cuda import available, kernels
    from adafuse.backend.cuda.attention import torch_varlen
    from adafuse.backend.cuda.choice import kernel_attention, probe_rows
    from adafuse.backend.cuda.layers import RMS_NORMS
    from tools import attention_probe

    device = torch.device(job["device"])
    like = torch.empty(0, dtype=torch.bfloat16, device=device)
    rows, requests, widest = job["rows"], job["requests"], job.get("max_out_features")
    if not available():
        ours = "triton is not installed"
    elif device.type == "cpu" and not kernels.interpreting():
        ours = "on a CPU the kernels run only under Triton's interpreter (TRITON_INTERPRET=1)"
    else:
        ours = None  # they run here
    shapes = pair_shapes(Path(job["pair"]), job["names"])

    def both(stock, kernel, check, width, counts) -> dict:
        return {
            "stock": attempt(check, stock, width, like, counts),
            "kernel": None if ours else attempt(check, kernel, width, like, counts),
        }

    linear = {}
    for out_features, in_features in shapes["linear"]:
        out_features = min(out_features, widest or out_features)
        weight = probe_rows(out_features, in_features, like, seed=1)
        linear[f"{out_features}x{in_features}"] = both(
            lambda x, w=weight: F.linear(x, w), lambda x, w=weight: kernels.linear(x, w), rows_alone, in_features, rows
        )
    norms = {}
    for module, cls, hidden, eps in shapes["rms_norm"]:
        norm = getattr(importlib.import_module(module), cls)(hidden, eps=eps).to(device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(probe_rows(1, hidden, like, seed=2)[0])
        formula = (eps, *RMS_NORMS[cls])  # epsilon, the offset added to the weight, whether it casts first
        norms[f"{cls} {hidden}"] = both(
            norm, lambda x, n=norm, f=formula: kernels.rms_norm(x, n.weight, *f), rows_alone, hidden, rows
        )
    softmax = {}
    for vocab in shapes["vocab"]:  # on the float32 logits a read's log-softmax takes (adafuse/backend/exact.py)
        softmax[str(vocab)] = both(
            lambda x: torch.log_softmax(x.float(), -1),
            lambda x: kernels.log_softmax(x.float()),
            rows_alone,
            vocab,
            rows,
        )
    heads = shapes["attention"]
    attention = {"x".join(map(str, heads)): both(torch_varlen(), kernel_attention, requests_alone, heads, requests)}
    heads_of = dict(zip(("heads", "kv_heads", "head_dim"), heads))
    return {
        "device": str(device),
        "dtype": "bfloat16",
        "rows": rows,
        "requests": requests,
        "kernels": ours or "ran",
        "linear": linear,
        "rms_norm": norms,
        "log_softmax": softmax,
        "attention": attention,
        "attention_ways": attempt(lambda probe: probe(str(device), torch.bfloat16, **heads_of), attention_probe.probe),
    }


def pair_shapes(pair: Path, names: list[str]) -> dict:
    """The pair's op shapes, from its config.json files through models made on the meta device (no memory): every
    linear layer's weight (out, in), every RMSNorm class with its module, width and epsilon, the vocabularies,
    and the attention's (heads, key/value heads, head size), the same in both models."""
    from transformers import AutoConfig, AutoModelForCausalLM

    linear, norms, vocab, heads = set(), set(), [], set()
    for name in names:
        config = AutoConfig.from_pretrained(pair / name)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                linear.add(tuple(module.weight.shape))
            elif type(module).__name__.endswith("RMSNorm"):
                eps = getattr(module, "variance_epsilon", None) or module.eps
                norms.add((type(module).__module__, type(module).__name__, module.weight.shape[0], eps))
        vocab.append(config.vocab_size)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        heads.add((config.num_attention_heads, config.num_key_value_heads, head_dim))
    (attention,) = heads
    return {"linear": sorted(linear), "rms_norm": sorted(norms), "vocab": vocab, "attention": attention}


def attempt(check, op, *args) -> dict:
    """`check(op, *args)`, or what stopped it: an op that cannot run here (torch's varlen kernel off CUDA or missing
    from this torch, a kernel this Triton cannot compile or interpret) is a finding, and the other ops still run."""
    if op is None:
        return {"error": "not available in this torch"}
    try:
        return check(op, *args)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"}


def rows_alone(op, width: int, like: torch.Tensor, counts: list[int]) -> dict:
    """Do rows 0 and n - 1 of `op` over n rows equal `op` over each row alone, bit for bit, at every count n?
    {"keeps_bits": whether at every one, "differs_at": the counts where not}."""
    from adafuse.backend.cuda.choice import probe_rows

    with torch.inference_mode():
        x = probe_rows(max(counts), width, like)
        alone = {i: op(x[i : i + 1]) for i in sorted({0, *(n - 1 for n in counts)})}
        differs = []
        for n in counts:
            out = op(x[:n])
            if not all(torch.equal(out[i : i + 1], alone[i]) for i in (0, n - 1)):
                differs.append(n)
    return {"keeps_bits": not differs, "differs_at": differs}


def requests_alone(attend, heads: tuple, like: torch.Tensor, counts: list[int]) -> dict:
    """Do the first, a middle and the last of n requests in one variable-length call (`attend(q, k, v, cu_q, cu_k,
    scale, window, max_q, max_k)`, causal) get the bits each gets alone, at every count n? As `rows_alone`.
    Requests of 1 to 9 queries after 120 to 1,100 cached keys, the lengths of NQ's and GSM8K's prompts, where a
    kernel that splits the keys of long requests would show it."""
    heads, kv_heads, head_dim = heads
    shapes = [(1 + (7 * i) % 9, 120 + (397 * i) % 1000) for i in range(max(counts))]
    generator = torch.Generator(device=like.device).manual_seed(1)

    def draw(n: int, h: int) -> torch.Tensor:
        return torch.randn(n, h, head_dim, generator=generator, device=like.device).to(like.dtype)

    parts = [(draw(q, heads), draw(q + c, kv_heads), draw(q + c, kv_heads)) for q, c in shapes]

    def call(which: list[int]) -> list[torch.Tensor]:
        qs, ks, vs = zip(*(parts[i] for i in which))
        cu_q = torch.tensor([0, *[len(q) for q in qs]], device=like.device).cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0, *[len(k) for k in ks]], device=like.device).cumsum(0).to(torch.int32)
        max_q, max_k = max(len(q) for q in qs), max(len(k) for k in ks)
        out = attend(torch.cat(qs), torch.cat(ks), torch.cat(vs), cu_q, cu_k, head_dim**-0.5, None, max_q, max_k)
        return list(out.split([len(q) for q in qs]))

    with torch.inference_mode():
        alone = [call([i])[0] for i in range(max(counts))]
        differs = []
        for n in counts:
            together = call(list(range(n)))
            if not all(torch.equal(together[i], alone[i]) for i in {0, n // 2, n - 1}):
                differs.append(n)
    return {"keeps_bits": not differs, "differs_at": differs}


# ---- run --------------------------------------------------------------------------------------------------


def run(job: dict) -> dict:
    """run.py's Hydra entry point on the job's overrides, as its command line would call it; under torch.profiler
    where the job asks (`profile_split`)."""
    import run as run_py  # run.py, at the checkout's root

    argv = sys.argv
    sys.argv = ["run.py", *job["overrides"]]
    profiler = torch.profiler.profile(activities=profiled_activities()) if job.get("profile") else None
    try:
        if profiler is not None:
            profiler.start()
        started = time.perf_counter()
        try:
            run_py.cli()
            status = 0
        except SystemExit as exit:  # a refused run: run.py said why in the log, as on its command line
            status = exit.code
        wall = time.perf_counter() - started
    finally:
        if profiler is not None:
            profiler.stop()
        sys.argv = argv
    record = {}
    if status:
        record["error"] = f"run.py exited with status {status} (the log above says why)"
    if profiler is not None:
        record["profile"] = profile_split(profiler, wall)
    return record


def profiled_activities() -> list:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def profile_split(profiler, wall: float) -> dict:
    """Where a profiled run's time went: seconds on the host waiting for the GPU (inside a synchronize call), the
    GPU's busy seconds (its kernels and copies), kernel launches (runtime and driver) and kernels run, inside
    torch's ops on the host, and the host ops and kernels that took longest."""
    from torch.autograd import DeviceType

    events = profiler.key_averages()
    host = [e for e in events if e.device_type == DeviceType.CPU]
    gpu = [e for e in events if e.device_type == DeviceType.CUDA]

    def top(found: list, seconds) -> list[dict]:
        ranked = sorted(found, key=seconds, reverse=True)[:TOP]
        return [{"name": e.key[:80], "count": e.count, "seconds": seconds(e)} for e in ranked]

    return {
        "wall_seconds": wall,
        "host_op_seconds": sum(e.self_cpu_time_total for e in host) / 1e6,
        "sync_wait_seconds": sum(e.self_cpu_time_total for e in host if "Synchronize" in e.key) / 1e6,
        "gpu_seconds": sum(e.self_device_time_total for e in gpu) / 1e6,
        "launches": sum(e.count for e in host if e.key.startswith(LAUNCHES)),
        "kernels": sum(e.count for e in gpu),
        "top_host_ops": top(host, lambda e: e.self_cpu_time_total / 1e6),
        "top_kernels": top(gpu, lambda e: e.self_device_time_total / 1e6),
    }


# ---- generate ---------------------------------------------------------------------------------------------


def generate(job: dict) -> dict:
    """transformers' greedy `generate()` over each prompt alone: the model loaded as loading.py loads a member
    (bfloat16, straight onto its device), its stop strings in one criterion built once, a warm-up of two
    tokens timed apart, then every prompt timed, the device synchronised at both ends. Texts cut before the first stop
    string, as a run's predictions are, by example id."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList, StopStringCriteria

    from conf.compose import compose_run
    from conf.schema import DataConf
    from eval.tasks import Task

    device = torch.device(job["device"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(job["path"])
    model = AutoModelForCausalLM.from_pretrained(job["path"], dtype=torch.bfloat16, device_map={"": device}).eval()
    load_seconds = time.perf_counter() - started
    cfg = OmegaConf.to_object(compose_run(f"task={job['task']}", f"task.limit={job['limit']}").task)
    task = Task(cfg, DataConf(dir=job["data_dir"]))
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer, list(cfg.stop))])

    def greedy(prompt: str, budget: int) -> tuple[str, int]:
        ids = tokenizer(prompt, return_tensors="pt").to(device)
        with torch.inference_mode():
            out = model.generate(
                **ids,
                max_new_tokens=budget,
                do_sample=False,
                stopping_criteria=stop,
                pad_token_id=tokenizer.eos_token_id,
            )
        new = out[0, ids.input_ids.shape[1] :]
        text = tokenizer.decode(new, skip_special_tokens=True)
        return text[: min((text.find(s) for s in cfg.stop if s in text), default=len(text))], len(new)

    prompts = {ex.id: task.prompt(ex) for ex in task.examples}
    started = time.perf_counter()
    greedy(next(iter(prompts.values())), 2)
    sync()
    warm_up = time.perf_counter() - started
    texts, tokens = {}, 0
    started = time.perf_counter()
    for example, prompt in prompts.items():
        texts[example], new = greedy(prompt, job["budget"])
        tokens += new
    sync()
    seconds = time.perf_counter() - started
    return {
        "load_seconds": load_seconds,
        "warm_up_seconds": warm_up,
        "decode_seconds": seconds,
        "examples": len(texts),
        "new_tokens": tokens,
        "ms_per_token": 1000 * seconds / max(tokens, 1),
        "device": str(device),
        "texts": texts,
    }


JOBS = {"build": build, "ops": ops, "run": run, "generate": generate}

if __name__ == "__main__":
    main()
