"""Section 9 of tools/bench_decode.py (`--only overhead`): the engine's host time per forward pass.

On the paper's pair in shape at its test size (tools/make_paper_pair.py: the real Llama-3 and Mistral
vocabularies, 2 layers, hidden 64) the arithmetic of a pass is small, so its wall time is mostly host time:
Python, op dispatch, the engine's own bookkeeping. That is the regime an 8B pass on a GPU is in at these
batch sizes, where the kernels of a few dozen rows cost about what one row costs. So the figures here say
what the engine adds to each pass where a GPU would pay it:

- transformers' own greedy `generate()` for each member at batch 1, on a copy of the model the engine never
  touched (what a user would run instead), with its stop criteria built once;
- `single` for each member at batch 1 and 8, and AdaFuse exact at batch 1 and 8, through `Ensemble.decode_stream`;
- for each: wall seconds, forward passes (generate(): its steps), rows per pass, milliseconds per pass, and
  whether the outputs are identical (generate()'s ids to `single`'s; every batch size's texts to batch 1's);
- a profile of one run of each engine kind (torch.profiler): the seconds spent inside torch's ops against the
  rest of the wall time, which is Python and op dispatch outside the ops, so that a change in host time is
  not mistaken for one in kernel time.

Runs alternate, `repeats` times; the ratios are computed on each repeat and their median reported.
"""

import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList, StopStringCriteria

from adafuse import Ensemble, ModelConfig, Request
from tools import make_paper_pair

RUNS = {
    "single_0@1": ("single", {"member": 0}, 1),
    "single_0@8": ("single", {"member": 0}, 8),
    "single_1@1": ("single", {"member": 1}, 1),
    "single_1@8": ("single", {"member": 1}, 8),
    "adafuse@8": ("adafuse", {}, 8),
    "adafuse@1": ("adafuse", {}, 1),
}


def paper_pair(dtype: str = "float32") -> tuple[Ensemble, list]:
    """The paper's pair in shape as members, and each model loaded again as transformers loads it (untouched)."""
    root = make_paper_pair.cached()
    configs = [ModelConfig(name=n, path=str(root / n), dtype=dtype) for n in make_paper_pair.DEFAULT]
    plain = [
        (AutoTokenizer.from_pretrained(root / n), AutoModelForCausalLM.from_pretrained(root / n, dtype=dtype).eval())
        for n in make_paper_pair.DEFAULT
    ]
    return Ensemble.from_config(configs), plain


def generate_greedy(tokenizer, model, requests: list[Request]) -> dict:
    """transformers' greedy `generate()` of each request at batch 1: seconds, steps (new tokens) and the new ids
    of each (its stop strings end it where `single`'s do)."""
    stops = {r.stop: StoppingCriteriaList([StopStringCriteria(tokenizer, list(r.stop))]) for r in requests if r.stop}
    outputs, steps = [], 0
    started = time.perf_counter()
    with torch.inference_mode():
        for r in requests:
            ids = torch.tensor([tokenizer.encode(r.prompt)])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=r.max_new_tokens,
                stopping_criteria=stops.get(r.stop),
                pad_token_id=tokenizer.eos_token_id,
            )
            new = out[0, ids.shape[1] :].tolist()
            steps += len(new)
            eos = model.generation_config.eos_token_id
            eos = set(eos if isinstance(eos, list) else [eos])
            outputs.append([t for t in new if t not in eos])
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "passes": steps, "ms_per_pass": 1000 * seconds / max(steps, 1), "ids": outputs}


def engine_run(
    ens: Ensemble, requests: list[Request], method: str, options: dict, batch_size: int, side_by_side: bool = True
) -> dict:
    """One method over the requests with `batch_size` in flight: seconds, passes, rows, texts and output ids.
    `side_by_side=False` runs every pass on the engine's thread (as on a GPU; where a profiler sees it)."""
    texts, ids = [None] * len(requests), [None] * len(requests)
    started = time.perf_counter()
    stream = ens.decode_stream(
        enumerate(requests), method=method, batch_size=batch_size, side_by_side=side_by_side, **options
    )
    for i, gen in stream:
        texts[i], ids[i] = gen.text, gen.ids
    seconds = time.perf_counter() - started
    models = stream.batching
    passes = sum(how["passes"] for how in models.values())
    rows = sum(how["rows"] for how in models.values())
    return {
        "seconds": seconds,
        "passes": passes,
        "rows_per_pass": rows / max(passes, 1),
        "ms_per_pass": 1000 * seconds / max(passes, 1),
        "models": {name: {k: how[k] for k in ("passes", "rows", "seconds")} for name, how in models.items()},
        "texts": texts,
        "ids": ids,
    }


def profiled(run) -> dict:
    """Wall seconds of `run()` under torch.profiler, and how much of it was inside torch's ops (each op's own
    time, children excluded, summed) against the rest: Python and dispatch outside the ops."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        run()
        wall = time.perf_counter() - started
    ops = sum(event.self_cpu_time_total for event in prof.key_averages()) / 1e6
    return {"wall_seconds": wall, "op_seconds": ops, "outside_op_seconds": wall - ops, "outside_share": 1 - ops / wall}


def compare_overhead(requests: list[Request], repeats: int = 3, dtype: str = "float32") -> dict:
    """Every run of RUNS and each member's generate(), alternating `repeats` times (module docstring)."""
    ens, plain = paper_pair(dtype)
    for method, options, size in RUNS.values():  # warm-up, not timed: kernels, the probes' row counts
        engine_run(ens, requests[:8], method, options, size)
    for tokenizer, model in plain:
        generate_greedy(tokenizer, model, requests[:2])
    runs: dict[str, list[dict]] = {name: [] for name in [*RUNS, "generate_0", "generate_1"]}
    for repeat in range(repeats):
        for k, (tokenizer, model) in enumerate(plain):
            runs[f"generate_{k}"].append(generate_greedy(tokenizer, model, requests))
        for name, (method, options, size) in RUNS.items():
            runs[name].append(engine_run(ens, requests, method, options, size))
        print(
            f"  {repeat + 1}/{repeats}: "
            + ", ".join(f"{name} {values[-1]['seconds']:.2f} s" for name, values in runs.items()),
            flush=True,
        )
    return summarise(runs, ens, requests, profiles(ens, plain, requests))


def profiles(ens: Ensemble, plain: list, requests: list[Request]) -> dict:
    """One profiled run of generate(), single at batch 1 and AdaFuse at batch 8 (the first member's, of each),
    every pass on the engine's thread, which the profiler records."""
    tokenizer, model = plain[0]
    return {
        "generate_0": profiled(lambda: generate_greedy(tokenizer, model, requests)),
        "single_0@1": profiled(lambda: engine_run(ens, requests, "single", {"member": 0}, 1, side_by_side=False)),
        "adafuse@8": profiled(lambda: engine_run(ens, requests, "adafuse", {}, 8, side_by_side=False)),
    }


def summarise(runs: dict[str, list[dict]], ens: Ensemble, requests: list[Request], profile: dict) -> dict:
    first = {name: values[0] for name, values in runs.items()}
    identical = {
        "single_0@1_ids_equal_generate": sum(
            a == b[0] for a, b in zip(first["generate_0"]["ids"], first["single_0@1"]["ids"])
        ),
        "single_1@1_ids_equal_generate": sum(
            a == b[0] for a, b in zip(first["generate_1"]["ids"], first["single_1@1"]["ids"])
        ),
    }
    for name in RUNS:
        base = name.split("@")[0] + "@1"
        identical[f"{name}_texts_equal_{base}"] = sum(
            all(r["texts"][i] == runs[base][0]["texts"][i] for r in runs[name]) for i in range(len(requests))
        )

    def median_ratio(numerator, denominator) -> float:
        return statistics.median(numerator(i) / denominator(i) for i in range(len(runs["adafuse@8"])))

    def seconds(name: str, i: int) -> float:
        return runs[name][i]["seconds"]

    def ms_per_pass(name: str, i: int) -> float:
        return runs[name][i]["ms_per_pass"]

    return {
        "prompts": len(requests),
        "budget": requests[0].max_new_tokens,
        "models": [m.name for m in ens.members],
        "repeats": len(runs["adafuse@8"]),
        "runs": {
            name: [{k: v for k, v in r.items() if k not in ("texts", "ids")} for r in values]
            for name, values in runs.items()
        },
        "identical": identical,
        "ratios": {
            "adafuse@8_over_summed_generate": median_ratio(
                lambda i: seconds("adafuse@8", i), lambda i: seconds("generate_0", i) + seconds("generate_1", i)
            ),
            "adafuse@1_over_summed_generate": median_ratio(
                lambda i: seconds("adafuse@1", i), lambda i: seconds("generate_0", i) + seconds("generate_1", i)
            ),
            "single_0@1_over_generate_0": median_ratio(
                lambda i: seconds("single_0@1", i), lambda i: seconds("generate_0", i)
            ),
            "single_1@1_over_generate_1": median_ratio(
                lambda i: seconds("single_1@1", i), lambda i: seconds("generate_1", i)
            ),
            # a merged pass of 8 examples (either model's) against one generate() step of the slower model
            "adafuse@8_pass_over_generate_0_step": median_ratio(
                lambda i: ms_per_pass("adafuse@8", i), lambda i: ms_per_pass("generate_0", i)
            ),
        },
        "profile": profile,
    }
