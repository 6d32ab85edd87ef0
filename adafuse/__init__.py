"""AdaFuse: adaptive word-level ensemble decoding of LLMs (arXiv 2601.06022), per ../shared/spec/adafuse.md."""

from adafuse.config import AdaFuseConfig, ModelConfig, SingleConfig
from adafuse.engine.loop import DEFAULT_BATCH_SIZE
from adafuse.ensemble import Ensemble, Job, ScoreJob, model_config, resolve_method
from adafuse.methods.session import Request, through_last_blank_line
from adafuse.text.tokenisation import ChatPrompt
from adafuse.trace import Generation, Stats, Trace

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "AdaFuseConfig",
    "ChatPrompt",
    "Ensemble",
    "Generation",
    "Job",
    "ModelConfig",
    "ScoreJob",
    "Request",
    "SingleConfig",
    "Stats",
    "Trace",
    "model_config",
    "resolve_method",
    "through_last_blank_line",
]
