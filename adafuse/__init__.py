"""AdaFuse: adaptive word-level ensemble decoding of LLMs (arXiv 2601.06022), per ../shared/spec/adafuse.md."""

from adafuse.config import AdaFuseConfig, ModelConfig, SingleConfig
from adafuse.ensemble import Ensemble
from adafuse.trace import Generation, Stats, Trace

__all__ = ["AdaFuseConfig", "Ensemble", "Generation", "ModelConfig", "SingleConfig", "Stats", "Trace"]
