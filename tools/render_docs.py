"""Render the measurements in results/bench/*.json into the tables of docs/*.md (most in docs/speed.md).

    python -m tools.render_docs            # rewrite every table between its markers
    python -m tools.render_docs --check    # exit 1 if a table is out of date (the docs check runs this)

A table lives, on any page of docs/, between `<!-- bench:NAME -->` and `<!-- /bench -->`; NAME is a
renderer registered below with `@renderer(NAME, FILE)`, which receives FILE's parsed JSON and returns
Markdown. A bench section that arrives with a new JSON file needs one such function and one marker pair
in a page. The block `<!-- bench:unrendered -->` lists the JSON files that no renderer reads, so none goes unseen.
A renderer registered with FILE None reads no file: docs/configuration.md's table of bad inputs, from
tools/bad_inputs.py. One registered with `absent` text stands for a measurement that only other hardware can make
(a GPU's): until its file exists, its block says so with that text, where any other missing file is an error.
"""

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from tools import bad_inputs

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "results" / "bench"
DOCS_DIR = ROOT / "docs"
UNRENDERED = "unrendered"
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /bench -->)", re.DOTALL)


class RenderError(Exception):
    """A marker names no renderer, or a renderer's JSON file is missing."""


RENDERERS: dict[str, tuple[str | None, Callable[[dict | None], str]]] = {}
ABSENT: dict[str, str] = {}  # name -> what its block says while its file does not exist


def renderer(name: str, file: str | None, absent: str | None = None):
    """Register `function(data) -> markdown` as the table `<!-- bench:name -->`, read from results/bench/file
    (file None: data is None); `absent`: the block's text while the file does not exist (else that is an error)."""

    def register(function: Callable[[dict], str]) -> Callable[[dict], str]:
        RENDERERS[name] = (file, function)
        if absent is not None:
            ABSENT[name] = absent
        return function

    return register


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance(file: str, data: dict) -> str:
    """Where a table's figures come from and what the run was."""
    facts = [f"`results/bench/{file}`"]
    if "threads" in data:
        facts.append(f"{data['threads']} thread" + ("" if data["threads"] == 1 else "s"))
    if "torch" in data:
        facts.append(f"torch {data['torch']}")
    if data.get("cpu"):
        facts.append(f"CPU {data['cpu']}")
    if "load_average" in data:
        one, five, fifteen = data["load_average"]
        facts.append(f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 minutes) at the end")
    if data.get("quick"):
        facts.append("quick run (a quarter of the prompts)")
    return "Source: " + ", ".join(facts) + "."


MIXED_SUITE = ["nq", "triviaqa", "squad", "gsm8k", "flores_de_en"]
METHOD_NAMES = {"single_0": "`single` member 0 (SmolLM2)", "single_1": "`single` member 1 (Gemma-3)"}


@renderer("methods", "decode.json")
def methods(data: dict) -> str:
    """Every method's cost against the members' summed greedy decoding, in total and per task."""
    singles = data["singles"]
    tasks = list(singles["per_task"])
    header = ["method", "wall time ÷ summed greedy", "passes per token ÷ summed greedy", *tasks]
    rows = []
    for method, ratios in singles["methods_vs_sum_of_singles"].items():
        suffix = "" if method == "adafuse" else f"_{method}"
        per_task = [f"{singles['per_task'][t][f'ratio{suffix}']:.2f}" for t in tasks]
        rows.append(
            [f"`{method}`", f"**{ratios['wall_time']:.2f}**", f"{ratios['forward_passes_per_generated_token']:.2f}"]
            + per_task
        )
    b1 = [f"{singles['per_task'][t]['ratio_b1']:.2f}" for t in tasks]
    rows.append(["`adafuse`, B = 1", f"{singles['ratio_b1_vs_sum_of_singles']:.2f}", "", *b1])
    prompts = ", ".join(
        f"{singles['per_task'][t]['prompts']} {t} ({singles['per_task'][t]['budget']} tokens)" for t in tasks
    )
    totals = singles["totals"]["adafuse"]
    per_round = " / ".join(f"{f / totals['rounds']:.2f}" for f in totals["forward"])
    fed = " / ".join(f"{f / g:.2f}" for f, g in zip(totals["fed"], totals["generated"]))
    notes = (
        f"{singles['prompts']} prompts: {prompts}. AdaFuse's forward passes per round, per model: {per_round}; "
        f"tokens fed per generated token (branch rows and padding included): {fed}."
    )
    return "\n\n".join([provenance("decode.json", data), table(header, rows), notes])


@renderer("reference", "reference.json")
def reference(data: dict) -> str:
    ref = data["reference"]
    row = [
        ref["prompts"],
        ", ".join(map(str, ref["prompt_tokens"])),
        ref["budget"],
        f"{ref['fast_seconds']:.1f}",
        f"{ref['reference_seconds']:.1f}",
        f"**{ref['speedup']:.1f}×**",
        f"{ref['identical_outputs']}/{ref['prompts']}",
    ]
    header = ["prompts", "prompt tokens", "new tokens", "fast (s)", "reference (s)", "speed-up", "identical outputs"]
    return provenance("reference.json", data) + "\n\n" + table(header, [row])


def batching_table(file: str, data: dict) -> str:
    """Examples per second at each batch size, per method, with the best size's gain and peak memory."""
    batching = data["batching"]
    sizes = batching["sizes"]
    methods = list(dict.fromkeys(key.split("@")[0] for key in batching["runs"]))
    header = ["examples per second", *[f"batch {s}" for s in sizes], "best ÷ batch 1", "identical to batch 1"]
    rows, memory = [], []
    for method in methods:
        runs = [batching["runs"][f"{method}@{s}"] for s in sizes]
        best = max(range(len(sizes)), key=lambda i: runs[i]["examples_per_second"])
        cells = [
            f"**{r['examples_per_second']:.3f}**" if i == best else f"{r['examples_per_second']:.3f}"
            for i, r in enumerate(runs)
        ]
        identical = min(r["identical_to_batch_1"] for r in runs)
        name = METHOD_NAMES.get(method, f"`{method}`")
        rows.append([name, *cells, f"{batching[f'{method}_speedup']:.2f}×", f"{identical}/{batching['prompts']}"])
        memory.append([name, *[f"+{r['peak_memory_gb']:.2f} GB" for r in runs]])
    # Files written before the bench recorded its tasks ran the mixed suite (bench_decode's BATCH_SUITE).
    tasks = ", ".join(batching.get("tasks", MIXED_SUITE))
    notes = (
        f"{batching['prompts']} prompts ({tasks}). AdaFuse at its best batch size takes "
        f"{batching['adafuse_best_vs_unbatched_singles']:.2f}× the time of the two members' unbatched greedy "
        "decoding. Peak memory above the loaded models:"
    )
    memory_header = ["peak memory", *[f"batch {s}" for s in sizes]]
    return "\n\n".join([provenance(file, data), table(header, rows), notes, table(memory_header, memory)])


@renderer("batching", "batching_after.json")
def batching_mixed(data: dict) -> str:
    return batching_table("batching_after.json", data)


@renderer("batching-nq", "batching_nq.json")
def batching_nq(data: dict) -> str:
    return batching_table("batching_nq.json", data)


@renderer("projection", "projection.json")
def projection(data: dict) -> str:
    heads = data["projection"]
    names = list(heads)
    header = ["rows", *[f"{n} ({heads[n]['vocab']:,} × {heads[n]['hidden']}): F.linear → blocked" for n in names]]
    rows = []
    for count in heads[names[0]]["rows"]:
        cells = []
        for n in names:
            r = heads[n]["rows"][count]
            same = "" if r["identical"] else ", logits differ"
            cells.append(f"{r['f_linear_ms']:.1f} → {r['blocked_ms']:.1f} ms ({r['speedup']:.2f}×{same})")
        rows.append([count, *cells])
    return provenance("projection.json", data) + "\n\n" + table(header, rows)


@renderer("authors", "authors.json")
def authors(data: dict) -> str:
    a = data["authors"]
    seconds, ratios = a["seconds"], a["vs_sum_of_singles"]
    header = ["decoder", "seconds", "÷ summed greedy", "same `pred` as their code"]
    rows = [
        ["their code", f"{seconds['authors']:.0f}", f"{ratios['authors']:.1f}", ""],
        [
            "`adafuse_code`",
            f"{seconds['adafuse_code']:.0f}",
            f"{ratios['adafuse_code']:.1f}",
            f"{a['identical_preds']}/{a['questions']}",
        ],
        [
            "`adafuse_code`, batch size 8",
            f"{seconds['adafuse_code_batch_8']:.0f}",
            "",
            f"{a['identical_preds_batch_8']}/{a['questions']}",
        ],
        ["`adafuse` (the paper's algorithm)", f"{seconds['adafuse']:.0f}", f"{ratios['adafuse']:.1f}", ""],
    ]
    knobs = ", ".join(f"{k} {v}" for k, v in a["knobs"].items())
    notes = (
        f"{a['questions']} NQ questions, {knobs}. `adafuse_code` is {a['speedup_over_authors']:.1f}× faster than "
        f"their code ({a['speedup_over_authors_batch_8']:.1f}× at batch size 8)."
    )
    return "\n\n".join([provenance("authors.json", data), table(header, rows), notes])


@renderer("attention", "attention_cpu.json")
def attention(data: dict) -> str:
    """A merged pass's attention per request against one call (tools/attention_probe.py)."""
    ways = {
        "sdpa_padded": "one SDPA call, requests right-padded, a mask",
        "varlen": "FlashAttention varlen, one call",
        "varlen_one_split": "the same, `num_splits=1`",
    }
    header = ["dtype", "way", "ms per merged pass", "each request's bits as alone", "as the same call over it alone"]
    header.append("largest difference from alone")
    rows = []
    for dtype, run in data["dtypes"].items():
        rows.append([dtype, "per request (the engine)", f"{run['per_request']['ms']:.1f}", "yes", "yes", "0"])
        for way, name in ways.items():
            got = run[way]
            if "error" in got:
                rows.append([dtype, name, "not run: " + got["error"].partition(": ")[2], "", "", ""])
                continue
            verdicts = ["yes" if got[v] else "no" for v in ("equals_alone", "batch_invariant")]
            rows.append([dtype, name, f"{got['ms']:.1f}", *verdicts, f"{got['max_difference']:.1e}"])
    first = next(iter(data["dtypes"].values()))
    widths, cached = zip(*first["shapes"], strict=True)
    heads = f"{first['heads']} heads over {first['kv_heads']} key/value heads of {first['head_dim']}"
    notes = (
        f"{len(widths)} requests of {min(widths)} to {max(widths)} queries after {min(cached)} to {max(cached):,} "
        f"cached positions, {heads}, seeded random inputs, on {first['device']}."
    )
    return "\n\n".join([provenance("attention_cpu.json", data), table(header, rows), notes])


@renderer("dtypes", "dtypes.json")
def dtypes(data: dict) -> str:
    header = ["method", "outputs that differ, bfloat16 vs float32"]
    rows = [[f"`{m}`", f"{r['differ']}/{r['prompts']}"] for m, r in data["methods"].items()]
    notes = f"Budget {data['budget']} new tokens per prompt."
    return "\n\n".join([provenance("dtypes.json", data), table(header, rows), notes])


@renderer("lm_eval", "lm_eval.json")
def lm_eval(data: dict) -> str:
    """The lm_eval model against the runner on the same prompts, each run in turn."""
    run = data["lm_eval"]
    header = ["decoder", "seconds per run", "total seconds"]
    rows = [
        [name, ", ".join(f"{s:.0f}" for s in seconds), f"{sum(seconds):.0f}"]
        for name, seconds in (("`python run.py`", run["seconds"]["runner"]), ("`lm_eval`", run["seconds"]["lm_eval"]))
    ]
    notes = (
        f"{run['prompts']} prompts, batch size {run['batch_size']}, {run['budget']} new tokens. lm_eval takes "
        f"**{run['ratio_lm_eval_vs_runner']:.2f}×** the runner's time; identical texts: "
        f"{run['identical_texts']}/{run['prompts']}."
    )
    return "\n\n".join([provenance("lm_eval.json", data), table(header, rows), notes])


EXACT_RUNS = {
    "exact_batch_8": "exact, batch 8",
    "not_exact_batch_8": "not exact (`batch_exact=false`), batch 8",
    "exact_batch_1": "exact, batch 1",
}


@renderer("exact", "exact_batching.json")
def exact(data: dict) -> str:
    """Exact batching against inexact batching and against no batching, on the same prompts."""
    e = data["exact"]
    header = [
        "AdaFuse",
        "examples per second",
        "passes",
        "rows per pass",
        "peak memory",
        "identical to exact b1",
    ]
    identical = {
        "exact_batch_8": e["identical_exact_8_to_exact_1"],
        "not_exact_batch_8": e["identical_not_exact_8_to_exact_1"],
        "exact_batch_1": None,
    }
    rows = [
        [
            label,
            f"{e['runs'][key]['examples_per_second']:.3f}",
            e["runs"][key]["passes"],
            f"{e['runs'][key]['rows_per_pass']:.1f}",
            f"+{e['runs'][key]['peak_memory_gb']:.2f} GB",
            "(itself)" if identical[key] is None else f"{identical[key]}/{e['prompts']}",
        ]
        for key, label in EXACT_RUNS.items()
    ]
    notes = (
        f"{e['prompts']} {e['task']} prompts, {e['budget']} new tokens. Exact batch 8 runs "
        f"**{e['exact_8_over_exact_1']:.2f}×** exact batch 1 (goal ≥ 1.7×) and "
        f"**{e['exact_8_over_not_exact_8']:.2f}×** not-exact batch 8 (goal ≥ 0.9×)."
    )
    return "\n\n".join([provenance("exact_batching.json", data), table(header, rows), notes])


@renderer("memory", "memory.json")
def memory(data: dict) -> str:
    """What a batch holds: peak memory and each model's KV, at batch 8 and batch 1."""
    m = data["memory"]
    header = ["run.py, 8 GSM8K problems", "peak resident memory", "seconds"]
    header += [
        f"{name}: KV held at most / per example / prompt prefixes / one context" for name in m["runs"]["8"]["models"]
    ]
    rows = []
    for batch in ("8", "1"):
        run = m["runs"][batch]
        cells = [f"batch {batch}", f"{run['peak_rss_gb']:.2f} GB", f"{run['seconds']:.0f}"]
        cells += [" / ".join(f"{how[key] / 2**20:.0f}" for key in KV_KEYS) + " MiB" for how in run["models"].values()]
        rows.append(cells)
    ratios = ", ".join(f"{name} {value:.2f}×" for name, value in m["kv_per_example_over_one_context"].items())
    notes = (
        f"`{m['command']}`. KV per example in flight over one context's: {ratios} (goal ≤ 2×). Batch 8 identical to "
        f"batch 1: {m['identical_8_to_1']}/{m['examples']}; to the committed results/grid run: batch 8 "
        f"{m['runs']['8']['identical_to_grid']}/{m['examples']}, "
        f"batch 1 {m['runs']['1']['identical_to_grid']}/{m['examples']}."
    )
    return "\n\n".join([provenance("memory.json", data), table(header, rows), notes])


KV_KEYS = ("kv_peak_bytes", "kv_peak_bytes_per_example", "kv_prefix_bytes", "one_context_bytes")


OVERHEAD_RUNS = {
    "generate_0": "transformers `generate()`, Llama-shaped, batch 1",
    "generate_1": "transformers `generate()`, Mistral-shaped, batch 1",
    "single_0@1": "`single` Llama-shaped, batch 1",
    "single_1@1": "`single` Mistral-shaped, batch 1",
    "single_0@8": "`single` Llama-shaped, batch 8",
    "single_1@8": "`single` Mistral-shaped, batch 8",
    "adafuse@8": "AdaFuse exact, batch 8",
    "adafuse@1": "AdaFuse exact, batch 1",
}
OVERHEAD_RATIOS = {
    "adafuse@8_over_summed_generate": ("AdaFuse exact batch 8 ÷ both members' summed `generate()`", "≤ 1.0"),
    "adafuse@1_over_summed_generate": ("AdaFuse exact batch 1 ÷ both members' summed `generate()`", ""),
    "single_0@1_over_generate_0": ("`single` batch 1 ÷ `generate()`, Llama-shaped", "≤ 1.1"),
    "single_1@1_over_generate_1": ("`single` batch 1 ÷ `generate()`, Mistral-shaped", "≤ 1.1"),
    "adafuse@8_pass_over_generate_0_step": ("a merged pass of 8 examples ÷ one Llama-shaped `generate()` step", "≤ 2"),
}


@renderer("overhead", "overhead.json")
def overhead(data: dict) -> str:
    """Section 9: the engine's time per pass against transformers' own generate(), on the paper pair in shape."""
    return overhead_tables("overhead.json", data)


def overhead_tables(file: str, data: dict) -> str:
    o = data["overhead"]

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in o["runs"][name])

    rows = [
        [
            label,
            ", ".join(f"{run['seconds']:.2f}" for run in o["runs"][name]),
            o["runs"][name][0]["passes"],
            f"{median(name, 'rows_per_pass'):.1f}" if "rows_per_pass" in o["runs"][name][0] else "1",
            f"{median(name, 'ms_per_pass'):.1f}",
        ]
        for name, label in OVERHEAD_RUNS.items()
    ]
    runs = table(["run", "seconds, each repeat", "passes (generate: steps)", "rows per pass", "ms per pass"], rows)
    ratios = table(
        ["ratio (median of the repeats)", "measured", "goal"],
        [[label, f"**{o['ratios'][key]:.2f}×**", goal] for key, (label, goal) in OVERHEAD_RATIOS.items()],
    )
    profiled = table(
        ["profiled once (torch.profiler)", "wall seconds", "in torch's ops", "outside them (Python, dispatch)"],
        [
            [OVERHEAD_RUNS[name], f"{p['wall_seconds']:.2f}", f"{p['op_seconds']:.2f}", f"{p['outside_share']:.0%}"]
            for name, p in o["profile"].items()
        ],
    )
    same = o["identical"]
    notes = (
        f"{o['prompts']} NQ prompts as the harness renders them (5-shot, shared prefix), {o['budget']} new tokens, "
        f"{o['repeats']} alternating repeats. Identical: `single` batch 1's ids to `generate()`'s "
        f"{same['single_0@1_ids_equal_generate']}/{o['prompts']} and {same['single_1@1_ids_equal_generate']}/"
        f"{o['prompts']}; every batch 8 text to batch 1's in every repeat: `single` "
        f"{same['single_0@8_texts_equal_single_0@1']} and {same['single_1@8_texts_equal_single_1@1']}, AdaFuse "
        f"{same['adafuse@8_texts_equal_adafuse@1']} of {o['prompts']}."
    )
    engine = f" Engine at commit {data['engine']}." if "engine" in data else ""
    engine += f" Pooled: {data['pooled']}." if "pooled" in data else ""
    engine += f" Left out: {data['excluded']}." if "excluded" in data else ""
    return "\n\n".join([provenance(file, data), runs, ratios, profiled, notes + engine])


@renderer("host", "host.json")
def host(data: dict) -> str:
    """Section 12: host time per pass at the paper pair's real depth, and the KV the engine copies."""
    h = data["host"]
    p = h["pass"]
    plain = p["plain_forward"]
    passes = table(
        ["one pass, float32", "ms (median)", "÷ one plain forward", "host ms", "host ÷ plain host",
         "in the requests' own attention"],
        [["transformers forward of 1 row (plain)", f"{plain['ms']:.1f}", "1.00×", f"{plain['host_ms']:.1f}", "1.00×",
          ""]]
        + [
            [f"merged pass of {m['requests']}", f"{m['ms']:.1f}", f"**{m['ms'] / plain['ms']:.2f}×**",
             f"{m['host_ms']:.1f}", f"**{m['host_ms'] / plain['host_ms']:.2f}×**", f"{m['attention_share']:.0%}"]
            for m in p["merged"]
        ],
    )  # fmt: skip
    d = h["decode"]
    named = [
        (f"`generate()`, {name}, batch 1", g) for name, g in zip(("Llama-shaped", "Mistral-shaped"), d["generate"])
    ]
    k = h["kernel_path"]
    named += [
        ("AdaFuse exact, batch 8, passes on the engine's thread (as on a GPU)", d["adafuse_b8"]),
        ("AdaFuse exact, batch 8, side by side (the CPU's default)", d["adafuse_b8_side_by_side"]),
    ]
    named += [
        (f"`generate()`, {name}, batch 1, beside the CUDA backend's code", g)
        for name, g in zip(("Llama-shaped", "Mistral-shaped"), k["generate"])
    ]
    named.append(("AdaFuse exact, batch 8, the CUDA backend's code (kernels stood in for)", k["adafuse_b8"]))
    decode = table(
        ["decode", "seconds", "host seconds", "passes (generate: steps)", "ms per pass"],
        [[name, f"{r['seconds']:.2f}", f"{r['host_seconds']:.2f}" if "host_seconds" in r else "", r["passes"],
          f"{r['ms_per_pass']:.1f}"] for name, r in named],
    )  # fmt: skip
    kernel_passes = table(
        ["one pass, the CUDA backend's code (kernels stood in for)", "ms (median)", "host ms", "host ÷ plain host",
         "launches"],
        [[f"merged pass of {m['requests']}", f"{m['ms']:.1f}", f"{m['host_ms']:.1f}",
          f"**{m['host_ms'] / plain['host_ms']:.2f}×**", m["launches"]] for m in k["merged"]],
    )  # fmt: skip
    c, sizes = h["copies"], h["sizes"]
    ratio, host_ratio = (d[k]["adafuse_b8_over_summed_generate"] for k in ("ratios", "host_ratios"))
    side = d["ratios"]["adafuse_b8_side_by_side_over_summed_generate"]
    copied, written = c["kv_bytes_copied_per_pass"] / 1024, c["kv_bytes_written_per_pass"] / 1024
    notes = (
        f"AdaFuse exact at batch 8 ÷ both members' summed `generate()`: **{ratio:.2f}×** in wall time, "
        f"**{host_ratio:.2f}×** in host time (goal ≤ 1.0); side by side, {side:.2f}× in wall time. KV the "
        f"engine copies per pass, over {c['passes']} passes of an AdaFuse run at batch 8: **{copied:.0f} KiB** "
        f"(goal 0), against {written:.0f} KiB of new KV written. The pair: {sizes['num_hidden_layers']} layers, "
        f"{sizes['num_attention_heads']} query and {sizes['num_key_value_heads']} key-value heads, hidden "
        f"{sizes['hidden_size']}; {h['prompts']} NQ prompts, {h['budget']} new tokens. Host time: wall time less "
        "the time inside the linear layers, attention and log-softmax."
    )
    run = k["adafuse_b8"]
    kernel_notes = (
        "The CUDA backend's code, its kernels stood in for by torch's ops on this CPU (their time counted as "
        "arithmetic, the GPU's there), timed with `generate()` beside it before the CPU backend's pair is loaded (a "
        "GPU node's process holds only the GPU's models): AdaFuse exact at batch 8 ÷ both members' summed "
        "`generate()` in host time: "
        f"**{k['adafuse_b8_host_over_summed_generate']:.2f}×** (goal ≤ 1.0), {run['launches'] / run['passes']:.0f} "
        f"launches a pass; KV the host copies per pass: **{run['kv_bytes_copied_per_pass'] / 1024:.0f} KiB** "
        f"(goal 0). Of its {run['host_seconds']:.2f} host seconds, the passes' tables (`InPlace.of`: each read's "
        f"claims in every layer, and their addresses) took {run['tables_seconds']:.2f} s "
        f"({run['tables_seconds'] / run['host_seconds']:.0%})."
    )
    return "\n\n".join([provenance("host.json", data), passes, kernel_passes, decode, notes, kernel_notes])


@renderer("serve", "serve.json")
def serve(data: dict) -> str:
    """Section 10: the server at 1, 8 and 32 clients against offline decoding at the batch size they keep in flight."""
    s = data["serve"]
    rows = [
        [
            clients,
            ", ".join(f"{x:.1f}" for x in run["seconds"]),
            f"{run['completions_per_second']:.2f}",
            f"{run['latency_p50']:.1f} / {run['latency_p95']:.1f}",
            ", ".join(f"{x:.1f}" for x in run["offline_seconds"]) + f" (batch {run['offline_batch_size']})",
            f"**{run['over_offline']:.2f}×**",
            f"{run['identical_texts']}/{s['prompts']}",
        ]
        for clients, run in s["served"].items()
    ]
    header = [
        "clients",
        "server seconds, each repeat",
        "completions per second",
        "latency p50 / p95 (s)",
        "offline seconds, each repeat",
        "server / offline (summed)",
        "texts identical to offline",
    ]
    notes = (
        f"{s['prompts']} NQ prompts (5-shot, the runner's prompts), {s['budget']} new tokens, AdaFuse on the bundled "
        f"pair, the server's batch size {s['batch_size']}, {s['repeats']} alternating repeats (identical texts: in "
        f"the worst). Goal at 8 clients: ≤ 1.10×, measured "
        f"**{s['served']['8']['over_offline']:.2f}×**."
    )
    return "\n\n".join([provenance("serve.json", data), table(header, rows), notes])


@renderer("default-run", "default_run.json")
def default_run(data: dict) -> str:
    """Section 8: run.py's default command against each member alone."""
    run = data["default_run"]
    labels = {
        "adafuse": "AdaFuse (the default)",
        "single_0": "SmolLM2 alone",
        "single_1": "Gemma-3 alone",
        "adafuse_one_after": "AdaFuse, one model's passes after the other's",
    }
    overrides = {
        "adafuse": "",
        "single_0": "`method=single method.member=0`",
        "single_1": "`method=single method.member=1`",
        "adafuse_one_after": "`batch_side_by_side=false`",
    }
    models = {"smollm2_135m": "SmolLM2", "gemma3_270m": "Gemma-3"}
    header = [
        "`python run.py` +",
        "decode seconds, each run",
        "passes' seconds, SmolLM2 / Gemma-3",
        "identical to results/grid",
    ]
    rows = [
        [
            f"{labels[name]} {overrides[name]}".strip(),
            ", ".join(f"{s:.1f}" for s in run["seconds"][name]),
            ", ".join(" / ".join(f"{p[m]:.1f}" if m in p else "–" for m in models) for p in run["pass_seconds"][name]),
            f"{run['identical_to_grid'][name]}/{run['examples']}",
        ]
        for name in labels
        if name in run["seconds"]
    ]
    per_repeat = ", ".join(f"{r:.2f}" for r in run["ratio_per_repeat"])
    notes = (
        f"{run['examples']} NQ questions, each command a fresh process, alternating. AdaFuse ÷ (SmolLM2 + "
        f"Gemma-3), best runs: **{run['ratio_of_best']:.2f}×** (goal ≤ 2.0×); each repeat: {per_repeat}. "
        "AdaFuse's passes alone on the machine (the last row's best run) take, over the members' summed decode "
        f"seconds: the slower model's **{run['slowest_model_passes_alone_over_members']:.2f}×**, both models' "
        f"**{run['both_models_passes_alone_over_members']:.2f}×** (below)."
    )
    return "\n\n".join([provenance("default_run.json", data), table(header, rows), notes])


@renderer("singles-early-finish", "singles_early_finish.json")
def singles_early_finish(data: dict) -> str:
    """Section 1 with early finish: AdaFuse and the two members only."""
    singles = data["singles"]
    tasks = list(singles["per_task"])
    header = ["", "all tasks", *tasks]
    ratio = ["AdaFuse wall time ÷ summed greedy", f"**{singles['ratio_vs_sum_of_singles']:.2f}**"]
    ratio += [f"{singles['per_task'][t]['ratio']:.2f}" for t in tasks]
    prompts = ["prompts (new tokens)", singles["prompts"]]
    prompts += [f"{singles['per_task'][t]['prompts']} ({singles['per_task'][t]['budget']})" for t in tasks]
    totals = singles["totals"]["adafuse"]
    passes = singles["methods_vs_sum_of_singles"]["adafuse"]["forward_passes_per_generated_token"]
    notes = (
        f"AdaFuse's passes per generated token ÷ summed greedy: {passes:.2f}; rounds with a winner: "
        f"{totals['rounds']}; examples that ended in an unscored round: {totals['early_finish']}."
    )
    return "\n\n".join([provenance("singles_early_finish.json", data), table(header, [ratio, prompts]), notes])


@renderer("bad-inputs", None)
def bad_input_table(_: None) -> str:
    """Every bad input the suite tries, and its message (tools/bad_inputs.py)."""
    return bad_inputs.table()


@renderer("report", "report.json")
def report(data: dict) -> str:
    """A full NQ run's report with and without traces: size, build time, and time to open in Chromium."""
    header = ["report", "size", "build (s)", "load in Chromium (s)", "open one example's rounds (s)"]
    rows = [
        [
            kind,
            f"{data[kind]['bytes'] / 1e6:.1f} MB",
            f"{data[kind]['build_seconds']:.1f}",
            f"{data[kind]['load_seconds']:.2f}",
            f"{data[kind]['expand_seconds']:.2f}",
        ]
        for kind in ("with traces", "without traces")
    ]
    facts = f"Source: `results/bench/report.json`, {data['examples']:,} examples, headless Chromium"
    if "load_average" in data:
        facts += ", load average " + " / ".join(f"{x:.1f}" for x in data["load_average"])
    return facts + ".\n\n" + table(header, rows)


GPU_RUN_LABELS = {
    "build": "the pair written to disk",
    "adafuse_exact_b8": "AdaFuse exact, batch 8",
    "adafuse_exact_b1": "AdaFuse exact, batch 1",
    "generate_llama_b1": "Llama `generate()`, batch 1",
    "generate_mistral_b1": "Mistral `generate()`, batch 1",
    "unite_b8": "UniTE, batch 8",
    "sweetspan_b8": "SweetSpan, batch 8",
    "gsm8k_adafuse_exact_b32": "GSM8K: AdaFuse exact, batch 32",
}
GPU_CHECK_ABSENT = (
    "No GPU has run `python -m tools.gpu_check` yet: there is no `results/bench/gpu_check.json`, and this "
    "block lists nothing until one does."
)


@renderer("gpu-check", "gpu_check.json", absent=GPU_CHECK_ABSENT)
def gpu_check(data: dict) -> str:
    """tools/gpu_check.py: issue 56's goals, the stages' seconds, the toolchain, the op report and each run."""
    check, tools = data["check"], data.get("toolchain", {})
    gpus = tools.get("gpus") or []
    where = f"{gpus[0]['name']}, driver {tools.get('driver')}, CUDA {tools.get('cuda')}" if gpus else "CPU"
    facts = [f"`results/bench/gpu_check.json`, {where}, torch {tools.get('torch')}, Triton {tools.get('triton')}"]
    if "layers" in data:
        facts.append(
            f"timing runs at {data['layers']['layers']} of {check['real_layers']} layers ({data['layers']['why']})"
        )
    facts += ["a dry run"] if check["dry_run"] else []
    parts = ["Source: " + ", ".join(facts) + "."]
    yes_no = {True: "yes", False: "**no**", None: "not known"}
    goals = data.get("goals", {})
    batch = goals.get("batch_8_texts_equal_batch_1_or_said_batch_dependent", {})
    texts = "; ".join(
        f"{stage}: {batch[stage].get('texts', 'not run')}" for stage in ("smoke", "timing") if stage in batch
    )
    memory = goals.get("gsm8k_b32_within_80_gb", {})
    rows = [
        ["batch 8's texts equal batch 1's, or the run says it is batch-dependent and why", texts, batch.get("met")],
        *(
            [
                label,
                "" if goals.get(key, {}).get("ratio") is None else f"{goals[key]['ratio']:.2f}×",
                goals.get(key, {}).get("met"),
            ]
            for key, label in (
                ("adafuse_b8_at_most_summed_generate_b1", "AdaFuse at batch 8 ≤ 1.0× the members' summed `generate()`"),
                ("adafuse_b8_at_most_1.1_unite_b8", "AdaFuse at batch 8 ≤ 1.1× UniTE's time"),
            )
        ),
        [
            "GSM8K's prompts at batch 32 within 80 GB",
            memory.get("error") or ("" if memory.get("peak_gb") is None else f"{memory['at_real_layers_gb']:.1f} GB"),
            memory.get("met"),
        ],
    ]
    parts.append(table(["goal (issue 56)", "found", "met"], [[a, b, yes_no[c]] for a, b, c in rows]))
    stages = data.get("stages", {})
    parts.append(
        "Stages (seconds of their budget): "
        + ", ".join(f"{name} {s['seconds']:.0f} of {s['budget_seconds']:.0f}" for name, s in stages.items())
        + "."
    )
    rows = []
    for stage in ("smoke", "timing"):
        for name, run in data.get(stage, {}).items():
            why = run.get("error") or run.get("cut") or run.get("skipped")
            label = f"{stage}: {GPU_RUN_LABELS.get(name, name)}"
            if why:
                rows.append([label, "", "", why.splitlines()[0][:100], ""])
                continue
            peak = max((m["peak_reserved_gb"] for m in run.get("memory", {}).values()), default=None)
            decode = run.get("decode_seconds")
            rows.append(
                [
                    label,
                    run.get("examples", ""),
                    f"{run['wall_seconds']:.1f}",
                    "" if decode is None else f"{decode:.1f}",
                    "" if peak is None else f"{peak:.1f} GB",
                ]
            )
    parts.append(table(["run", "examples", "wall s", "decode s", "peak GPU memory"], rows))
    ops = data.get("ops", {})
    if "linear" in ops:

        def verdict(found: dict) -> str:
            if "error" in found:
                return "not run: " + found["error"][:80]
            bits = "keeps bits" if found["keeps_bits"] else "differs at " + ", ".join(map(str, found["differs_at"]))
            return bits + "; " + ", ".join(f"{ms:.3g} ms at {n}" for n, ms in found["ms"].items())

        rows = [
            [op, shape, verdict(found["stock"]), verdict(found["kernel"])]
            for op in ("linear", "rms_norm", "log_softmax", "attention")
            for shape, found in ops[op].items()
        ]
        parts.append(table(["op", "shape", "stock kernel", "the backend's kernel"], rows))
        parts.append(
            f"A row's bits alone against among others (attention: a request's), {ops['dtype']}, on {ops['device']}; "
            "the milliseconds of one call at the row (request) counts given."
        )
    return "\n\n".join(parts)


def unrendered(bench_dir: Path) -> str:
    read = {file for file, _ in RENDERERS.values() if file is not None}
    left = sorted(p.name for p in bench_dir.glob("*.json") if p.name not in read)
    if not left:
        return "Every file in `results/bench/` is rendered on a page of docs/."
    return "No table renders these yet:\n\n" + "\n".join(f"- `results/bench/{name}`" for name in left)


def pages(docs_dir: Path = DOCS_DIR) -> list[Path]:
    """The documentation pages that hold at least one bench block."""
    return [path for path in sorted(docs_dir.glob("*.md")) if BLOCK.search(path.read_text())]


def render(page: str, bench_dir: Path = BENCH_DIR) -> str:
    """The page with every bench block rewritten from the JSON files."""

    def block(match: re.Match) -> str:
        name = match["name"]
        if name == UNRENDERED:
            body = unrendered(bench_dir)
        elif name in RENDERERS and RENDERERS[name][0] is None:
            body = RENDERERS[name][1](None)
        elif name in RENDERERS:
            file, function = RENDERERS[name]
            path = bench_dir / file
            if path.is_file():
                body = function(json.loads(path.read_text()))
            elif name in ABSENT:
                body = ABSENT[name]
            else:
                raise RenderError(f"bench:{name} reads {path}, which does not exist")
        else:
            raise RenderError(f"bench:{name} names no renderer; known: {sorted(RENDERERS)} and {UNRENDERED!r}")
        return f"{match[1]}\n{body}\n\n{match[4]}"

    return BLOCK.sub(block, page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's tables are out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in pages():
        page = path.read_text()
        rendered = render(page)
        if rendered == page:
            continue
        if args.check:
            stale.append(path)
            print(f"{path} is out of date: run python -m tools.render_docs")
        else:
            path.write_text(rendered)
            print(f"rendered {len(BLOCK.findall(page))} tables into {path}")
    if args.check and not stale:
        print("every page's tables are up to date")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
