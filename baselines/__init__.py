"""Ensemble baselines of the paper's Table 1 (../shared/research/baselines.md), one file per method.

Each module registers its method in `adafuse.methods.METHODS` when imported; this package imports
every one of them, and adafuse/methods.py imports this package, so a registered name is always there.
"""

from baselines import deepen, llm_blender, sweetspan, unite  # noqa: F401
