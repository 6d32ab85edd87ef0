"""Ensemble baselines of the paper's Table 1 (../shared/research/baselines.md), one method per module.

The package also holds the AdaFuse authors' released decoder (`adafuse_code.py`, `method=adafuse_code`),
which produced Table 1's AdaFuse numbers and differs from the paper's algorithm (`method=adafuse`).

Each method module defines `METHOD` (adafuse.methods.Method); pyproject.toml lists them in the
`adafuse.methods` entry-point group, through which the engine finds them on first lookup.
"""
