"""Ensemble baselines, one file per method, each `generate(members, prompt, cfg, *, stop, max_new_tokens,
trace) -> Generation` registered in `METHODS` (LLM-Blender, DeePEn, SweetSpan and UniTE join as they land;
../shared/research/baselines.md). AdaFuse and single-model greedy decoding are registered by the engine."""

from adafuse.methods import METHODS

__all__ = ["METHODS"]
