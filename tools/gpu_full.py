"""The paper's main setting at its real sizes on one GPU, in one short call: one JSON.

    python -m tools.gpu_check --full             # results/bench/gpu_full.json, in under 8 minutes (--limit)
    python -m tools.gpu_check --full --dry-run   # every step on a CPU, at a small size

Llama-3.1-8B-Instruct and Mistral-7B-Instruct-v0.3 at their real sizes (hidden 4096, intermediate
14,336, 32 layers, 32 heads, 8 KV heads), with their real vocabularies, tokenizers and hub configs
(tools/make_paper_pair.py `write_model_files`) and seeded random bfloat16 weights built on the GPU in
memory (`random_model`: no weights on disk), decode NQ prompts as the harness renders them (5-shot,
the shared prefix read once per model). Each run is recorded as it ends:

1. transformers' own greedy `generate()` for each member at batch 1, on the bare model, before a
   member's wrappers are installed on it (what a user would run instead), its stop strings in one
   criterion built once per member;
2. `single` for each member at batch 1 and 8 (exact): texts and every step's log-probability, bit for bit;
3. AdaFuse exact at batch 8, not exact at batch 8, and exact at batch 1: merged passes, rows per pass,
   how each model's requests met (`DecodeStream.batching`), texts against exact batch 1;
4. UniTE and SweetSpan at batch 8 (the paper's Figure 5 compares their wall time with AdaFuse's);
5. the row tile and the one-call verdicts the probes chose for each weight shape (adafuse/backend/tiles.py),
   and each run's peak GPU memory; whether a merged pass's attention could run in one call on this GPU and
   keep every request's bits (tools/attention_probe.py, at the pair's heads);
6. the ratios: AdaFuse (exact, batch 8) over the members' summed `generate()` and over their summed
   `single` at batch 8; exact over not exact; batch 8 over batch 1; UniTE and SweetSpan over AdaFuse.

Every run is timed after a warm-up (the probes, the kernels, each model's read of the shared prefix).
AdaFuse exact at batch 1, the costliest, runs last. A run still going at the deadline stops there and
says how far it got, and the runs after it are skipped, saying so: the ratios are taken over whole runs.
The dry run (`--dry-run`; tests/integration/test_gpu_full.py) builds the pair on the CPU at hidden 256
with 2 layers, the vocabularies real, and runs every step on a few prompts.
"""

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, StoppingCriteriaList, StopStringCriteria

from adafuse import Ensemble, Request
from adafuse.backend import backend_for
from adafuse.member.member import Member
from tools import attention_probe, make_paper_pair
from tools.bench_decode import task_requests
from tools.gpu_check import StepRecord, environment

NAMES = make_paper_pair.DEFAULT
SHORT = dict(zip(NAMES, ("llama", "mistral")))
SIZES = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
DRY_RUN_SIZES = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
}
PROMPTS, BUDGET, LIMIT = 16, 32, 480.0
DRY_RUN_PROMPTS, DRY_RUN_BUDGET, DRY_RUN_LIMIT = 3, 5, 600.0
# name: (method, knobs, batch size, exact), in the order they run
ENGINE_RUNS = {
    **{
        f"single_{SHORT[name]}_b{size}": ("single", {"member": k}, size, True)
        for k, name in enumerate(NAMES)
        for size in (1, 8)
    },
    "adafuse_exact_b8": ("adafuse", {}, 8, True),
    "adafuse_not_exact_b8": ("adafuse", {}, 8, False),
    "unite_b8": ("unite", {}, 8, True),
    "sweetspan_b8": ("sweetspan", {}, 8, True),
    "adafuse_exact_b1": ("adafuse", {}, 1, True),
}


def check(out: Path, data_dir: Path, dry_run: bool = False, limit=None, prompts=None, budget=None) -> dict:
    """Every step, recorded to `out` as it ends; the record."""
    device = "cpu" if dry_run else "cuda"
    sizes = DRY_RUN_SIZES if dry_run else SIZES
    budget = budget or (DRY_RUN_BUDGET if dry_run else BUDGET)
    requests = task_requests("nq", prompts or (DRY_RUN_PROMPTS if dry_run else PROMPTS), data_dir, budget)
    requests = [replace(r, trace=True) for r in requests]
    facts = {"environment": environment(), "dry_run": dry_run, "sizes": sizes, "prompts": len(requests)}
    record = StepRecord(out, limit or (DRY_RUN_LIMIT if dry_run else LIMIT), facts | {"budget": budget})
    pair: dict[str, tuple] = {}

    def build(left: float) -> dict:
        for name in NAMES:
            pair[name] = bare_model(name, sizes, device)
        return {
            name: {"parameters": sum(p.numel() for p in model.parameters()), "vocab": model.config.vocab_size}
            for name, (_, model) in pair.items()
        }

    record.step("build", build)
    if len(pair) < len(NAMES):
        return record.record
    record.step("attention", lambda left: attention_probe.probe(device, torch.bfloat16, **heads_of(sizes)))
    generations: dict[str, dict] = {}

    def run(name: str, decode, *args, **knobs) -> None:
        def until_deadline(left: float) -> dict:
            generations[name], figures = decode(*args, end=time.perf_counter() + left, **knobs)
            return figures

        record.step(name, until_deadline)

    for name, (tokenizer, model) in pair.items():  # before `ensemble_of` installs the members' wrappers on them
        run(f"generate_{SHORT[name]}_b1", generate_alone, tokenizer, model, requests, device)
    engine = {}

    def start_engine(left: float) -> dict:
        engine["ensemble"] = ensemble_of(pair)
        return warm_up(engine["ensemble"], requests, device)

    record.step("warm_up", start_engine)
    if "ensemble" not in engine:
        return record.record
    for name, (method, knobs, size, exact) in ENGINE_RUNS.items():
        run(name, decode_run, engine["ensemble"], requests, device, method, size, exact, **knobs)
    linear = [m for _, model in pair.values() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    record.put("probes", probe_verdicts(device, {tuple(m.weight.shape) for m in linear}))
    record.put("identical", identical(generations, len(requests)))
    record.put("ratios", ratios(record.record))
    return record.record


def heads_of(sizes: dict) -> dict:
    """The attention's heads, key/value heads and head size (both models of the pair have the same)."""
    heads = sizes["num_attention_heads"]
    return {"heads": heads, "kv_heads": sizes["num_key_value_heads"], "head_dim": sizes["hidden_size"] // heads}


def bare_model(name: str, sizes: dict, device: str) -> tuple:
    """(tokenizer, model): the hub's files at `sizes` written to a temporary folder, the tokenizer and the
    generation config loaded from them as from the hub, and the model built on `device` in bfloat16 with
    seeded random weights."""
    with tempfile.TemporaryDirectory() as folder:
        make_paper_pair.write_model_files(Path(folder), name, sizes)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = make_paper_pair.random_model(Path(folder), name, device, torch.bfloat16)
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return tokenizer, model


class Timed:
    """A block's wall seconds, the device synchronised at both ends, and the GPU's memory in it: allocated at
    its start and at its peak (None on a CPU)."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"

    def __enter__(self) -> "Timed":
        self.start_gb = self.peak_gb = None
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start_gb = torch.cuda.memory_allocated() / 2**30
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak_gb = torch.cuda.max_memory_allocated() / 2**30
        self.seconds = time.perf_counter() - self.started

    def figures(self, done: int, of: int) -> dict:
        cut = {} if done == of else {"cut": f"stopped at the deadline after {done} of {of} prompts"}
        memory = {"memory_gb": self.start_gb, "peak_memory_gb": self.peak_gb}
        return {"decode_seconds": self.seconds, "prompts": done, **cut, **memory}


def generate_alone(tokenizer, model, requests: list[Request], device: str, end: float) -> tuple[dict, dict]:
    """transformers' greedy `generate()` over each prompt alone until `end` (perf_counter seconds), after an
    untimed warm-up; the requests' stop strings (the task's) in one criterion, built once."""
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer, list(requests[0].stop))])
    generate(tokenizer, model, stop, requests[:1], device, max_new_tokens=2)
    return generate(tokenizer, model, stop, requests, device, end)


def generate(tokenizer, model, stop, requests: list[Request], device: str, end=None, max_new_tokens=None):
    """`generate()` over each prompt alone until `end` (perf_counter seconds; None: to the last), for
    `max_new_tokens` or each request's budget: ({prompt index: text cut before its first stop string}, figures)."""
    texts = {}
    with Timed(device) as timed:
        for i, request in enumerate(requests):
            if end is not None and time.perf_counter() > end:
                break
            ids = tokenizer(request.prompt, return_tensors="pt").to(model.device)
            output = model.generate(
                **ids,
                max_new_tokens=max_new_tokens or request.max_new_tokens,
                do_sample=False,
                stopping_criteria=stop,
                pad_token_id=tokenizer.eos_token_id,
            )
            text = tokenizer.decode(output[0, ids.input_ids.shape[1] :], skip_special_tokens=True)
            texts[i] = text[: min((text.find(s) for s in request.stop if s in text), default=len(text))]
    return texts, timed.figures(len(texts), len(requests))


def warm_up(ensemble: Ensemble, requests: list[Request], device: str) -> dict:
    """The runs at batch 8 over two tokens of the first 8 prompts, untimed: the probes of the row counts that
    merged passes reach, the kernels, and each model's read of the shared prefix."""
    short = [replace(r, max_new_tokens=2, trace=False) for r in requests[:8]]
    for method, knobs, size, exact in ENGINE_RUNS.values():
        if size == 8:
            decode_run(ensemble, short, device, method, size, exact, **knobs)
    return {}


# ---- the engine, reached only here: the three functions to adapt when its API changes ---------------------


def ensemble_of(pair: dict[str, tuple]) -> Ensemble:
    """The engine's ensemble over models in memory; the first member of a model installs the backend on it."""
    return Ensemble([Member(name, tokenizer, model) for name, (tokenizer, model) in pair.items()])


def decode_run(ensemble: Ensemble, requests, device, method, batch_size, exact, end=None, **knobs):
    """Decode the requests with `Ensemble.decode_stream` until `end` (perf_counter seconds; None: to the
    last): ({prompt index: Generation}, figures with how each model's requests met)."""
    done = {}
    with Timed(device) as timed:
        stream = ensemble.decode_stream(enumerate(requests), method=method, batch_size=batch_size, exact=exact, **knobs)
        for i, gen in stream:
            done[i] = gen
            if end is not None and time.perf_counter() > end and len(done) < len(requests):
                stream.close()
                break
    batching = stream.batching
    passes = sum(model["passes"] for model in batching.values())
    return done, timed.figures(len(done), len(requests)) | {
        "merged_passes": sum(model["merged_passes"] for model in batching.values()),
        "rows_per_pass": sum(model["rows"] for model in batching.values()) / max(passes, 1),
        "batching": batching,
    }


def probe_verdicts(device: str, shapes: set[tuple[int, int]]) -> dict:
    """Per bfloat16 weight shape (out x in) on `device`: the rows of its tile, and per padded row count
    whether one multiply gives every tile's bits (adafuse/backend/tiles.py); a shape never multiplied is absent."""
    probes = backend_for(torch.device(device)).probes

    def ours(key: tuple) -> str | None:
        where, dtype, shape = key[:3]
        if where.type == torch.device(device).type and dtype == torch.bfloat16 and shape in shapes:
            return "x".join(map(str, shape))
        return None

    verdicts = {ours(key): {"tile_rows": rows, "one_call": {}} for key, rows in probes.tile_rows.items() if ours(key)}
    for (key, rows), whole in sorted(probes.one_call.items(), key=lambda item: item[0][1]):
        if ours(key) in verdicts:
            verdicts[ours(key)]["one_call"][str(rows)] = whole
    return verdicts


# ---- what the runs show -----------------------------------------------------------------------------------


def identical(generations: dict[str, dict], prompts: int) -> dict:
    """Each comparison over the prompts both runs finished: texts equal, and for `single` every step's
    log-probability equal bit for bit."""

    def text(gen) -> str:
        return gen if isinstance(gen, str) else gen.text

    def compare(a: str, b: str, logprobs: bool = False) -> dict:
        both = sorted(set(generations.get(a, {})) & set(generations.get(b, {})))
        pairs = [(generations[a][i], generations[b][i]) for i in both]
        row = {"prompts": len(both), "of": prompts, "texts": sum(text(x) == text(y) for x, y in pairs)}
        if logprobs:
            steps = [([s.logprob for s in x.trace.steps], [s.logprob for s in y.trace.steps]) for x, y in pairs]
            row["logprobs_bitwise"] = sum(x == y for x, y in steps)
        return row

    rows = {}
    for name in SHORT.values():
        rows[f"single_{name}_b8_vs_b1"] = compare(f"single_{name}_b8", f"single_{name}_b1", logprobs=True)
        rows[f"generate_{name}_b1_vs_single_b1"] = compare(f"generate_{name}_b1", f"single_{name}_b1")
    for name in ("adafuse_exact_b8", "adafuse_not_exact_b8"):
        rows[f"{name}_vs_exact_b1"] = compare(name, "adafuse_exact_b1")
    return rows


def ratios(record: dict) -> dict:
    """Wall-time ratios of whole runs (None where a run was cut, skipped or failed)."""

    def seconds(*names: str) -> float | None:
        runs = [record.get(name, {}) for name in names]
        whole = all("decode_seconds" in run and "cut" not in run for run in runs)
        return sum(run["decode_seconds"] for run in runs) if whole else None

    def over(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b is not None else None

    adafuse = seconds("adafuse_exact_b8")
    return {
        "adafuse_exact_b8_over_summed_generate_b1": over(adafuse, seconds("generate_llama_b1", "generate_mistral_b1")),
        "adafuse_exact_b8_over_summed_single_b8": over(adafuse, seconds("single_llama_b8", "single_mistral_b8")),
        "adafuse_exact_b8_over_not_exact_b8": over(adafuse, seconds("adafuse_not_exact_b8")),
        "adafuse_exact_b8_over_exact_b1": over(adafuse, seconds("adafuse_exact_b1")),
        "unite_b8_over_adafuse_exact_b8": over(seconds("unite_b8"), adafuse),
        "sweetspan_b8_over_adafuse_exact_b8": over(seconds("sweetspan_b8"), adafuse),
    }
