"""Ensemble baselines of the paper's Table 1 (../shared/research/baselines.md), one method per module.

Each method module defines `METHOD` (adafuse.methods.Method); pyproject.toml lists them in the
`adafuse.methods` entry-point group, through which the engine finds them on first lookup.
"""
