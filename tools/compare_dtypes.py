"""float32 against bfloat16 on the paper's pair in shape (tools/make_paper_pair.py): how many outputs
differ, and whether each difference starts at a near-tie.

    python -m tools.compare_dtypes                      # 24 NQ prompts, every method; a few minutes on 2 cores
    python -m tools.compare_dtypes --prompts 8 --out /tmp/dtypes.json

Scores are computed in float32 whatever the weights' dtype (Member._log_softmax upcasts the logits
before the log-softmax; margins, NLLs and every fused score are float32 arithmetic on them), so the
two runs differ only where bfloat16 weights and activations move the logits themselves. For each
output that differs, the first decision that differs is found and its gap measured in the float32
run: for `single`, the top-1 minus top-2 logit gap at the first differing token (also in units of
bfloat16's spacing at that logit's size); for AdaFuse,
at the first differing round, either a model's margin against τΔ (a word start that crossed the
confidence threshold) or the fused-score gap between the two runs' winners. A small gap is a
near-tie: rounding, not a bug, decided it. Writes results/bench/dtypes.json.
"""

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from adafuse import AdaFuseConfig, Ensemble, Request, SingleConfig
from adafuse.config import ModelConfig
from adafuse.engine.loop import drive
from adafuse.ensemble import resolve_method
from baselines.deepen import DeepenConfig
from baselines.llm_blender import LLMBlenderConfig
from baselines.sweetspan import SweetSpanConfig
from baselines.unite import UniteConfig
from tools import make_paper_pair
from tools.bench_decode import task_requests

ROOT = Path(__file__).resolve().parent.parent

METHODS = {
    "adafuse": AdaFuseConfig(),
    "single_llama": SingleConfig(0),
    "single_mistral": SingleConfig(1),
    "unite": UniteConfig(),
    "deepen": DeepenConfig(max_anchors=2000, support=512),
    "sweetspan": SweetSpanConfig(),
    "llm_blender": LLMBlenderConfig(),
}


def load(pair_dir: Path, dtype: str) -> Ensemble:
    names = make_paper_pair.DEFAULT
    return Ensemble.from_config([ModelConfig(name=n, path=str(pair_dir / n), dtype=dtype) for n in names])


def first_greedy_gap(fp32, bf16) -> dict | None:
    """Where two greedy runs first chose differently: the float32 top-1 minus top-2 logit gap, and that
    gap in units of bfloat16's spacing at the top logit's size (its resolution there)."""
    for a, b in zip(fp32.trace.steps, bf16.trace.steps):
        if a.token != b.token:
            spacing = 2.0 ** (math.floor(math.log2(abs(a.top_logit))) - 7) if a.top_logit else 0.0
            return {"gap": a.gap, "top_logit": a.top_logit, "bf16_spacings": a.gap / spacing if spacing else None}
    return None


def first_adafuse_gap(fp32, bf16, tau: float) -> dict | None:
    """Where two AdaFuse runs first differ, and the float32 gap that decided it."""
    for a, b in zip(fp32.trace.rounds, bf16.trace.rounds):
        for ma, mb in zip(a.models, b.models):
            for da, db in zip(ma.margins, mb.margins):
                if (da >= tau) != (db >= tau):
                    return {"where": "margin vs tau", "float32_margin": da, "bfloat16_margin": db}
        texts_a = [c.text for c in a.candidates]
        won_a, won_b = a.candidates[a.winner].text, b.candidates[b.winner].text
        if won_a != won_b:
            if won_b in texts_a:
                gap = abs(a.candidates[texts_a.index(won_b)].fused - a.candidates[a.winner].fused)
                return {"where": "winner", "fused_gap": gap}
            return {"where": "pool"}  # a proposal differed without a margin crossing τ: an argmax flip
    return None


def compare(pair_dir: Path, requests: list[Request]) -> dict:
    pairs = {dtype: load(pair_dir, dtype) for dtype in ("float32", "bfloat16")}
    report = {}
    for name, cfg in METHODS.items():
        spec, cfg = resolve_method(cfg, {})
        differ, gaps = 0, []
        for request in requests:
            out = {dtype: drive(spec.generate(pair.members, request, cfg)) for dtype, pair in pairs.items()}
            if out["float32"].text == out["bfloat16"].text:
                continue
            differ += 1
            if name.startswith("single"):
                _attach_gaps(out["float32"], pairs["float32"].members[cfg.member], request.prompt)
                gaps.append(first_greedy_gap(out["float32"], out["bfloat16"]))
            elif name == "adafuse":
                gaps.append(first_adafuse_gap(out["float32"], out["bfloat16"], cfg.tau))
        report[name] = {"prompts": len(requests), "differ": differ, "first_divergences": gaps}
        print(f"{name:15s} {differ:2d}/{len(requests)} outputs differ", flush=True)
        for gap in gaps:
            print(f"    first divergence: {gap}", flush=True)
    return report


def _attach_gaps(gen, member, prompt: str) -> None:
    """Each greedy step's float32 top logit and top-1 minus top-2 gap, read with one cache-free pass."""
    ids = member.tokenisation.encode(prompt) + gen.ids[0]
    with torch.inference_mode():
        logits = member.model(input_ids=torch.tensor([ids], device=member.device)).logits[0].float()
    start = len(ids) - len(gen.ids[0]) - 1
    for i, step in enumerate(gen.trace.steps):
        top = logits[start + i].topk(2).values
        step.gap, step.top_logit = (top[0] - top[1]).item(), top[0].item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=24, help="NQ prompts (the harness's own)")
    parser.add_argument("--budget", type=int, default=24)
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results/bench/dtypes.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    requests = [replace(r, trace=True) for r in task_requests("nq", args.prompts, args.data_dir, args.budget)]
    report = compare(make_paper_pair.cached(), requests)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"budget": args.budget, "methods": report}, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
