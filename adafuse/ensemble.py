"""The Python API: load an ensemble once, decode prompts with any registered method.

from adafuse import Ensemble
ens = Ensemble.from_config(["smollm2_135m", "gemma3_270m"])
gen = ens.decode("Question: What is the capital of France?\\nAnswer:", stop=["\\n"], max_new_tokens=16)
gen.text, gen.stats, gen.trace
"""

from dataclasses import asdict, fields
from pathlib import Path

import yaml

from adafuse.config import ModelConfig
from adafuse.errors import UnknownNameError
from adafuse.loading import load_pretrained
from adafuse.methods import METHODS
from adafuse.model import Member
from adafuse.trace import Generation

MODEL_CONFIGS = Path(__file__).resolve().parent.parent / "conf" / "model"


def model_config(entry) -> ModelConfig:
    """A ModelConfig from a ModelConfig, a dict, or the name of a file in conf/model/."""
    if isinstance(entry, ModelConfig):
        return entry
    if isinstance(entry, str):
        path = MODEL_CONFIGS / f"{entry}.yaml"
        if not path.is_file():
            raise UnknownNameError("model", entry, [p.stem for p in MODEL_CONFIGS.glob("*.yaml")])
        entry = yaml.safe_load(path.read_text())
    known = {f.name for f in fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in dict(entry).items() if k in known})


class Ensemble:
    def __init__(self, members: list[Member]):
        if not members:
            raise ValueError("an ensemble needs at least one model")
        self.members = members

    @classmethod
    def from_config(cls, models, cache_dir=None) -> "Ensemble":
        """Load each model once; a model listed twice gets two members that share its weights."""
        configs = [model_config(m) for m in models]
        loaded = {}
        members = []
        for cfg in configs:
            key = (cfg.path, cfg.bundle, cfg.dtype, cfg.device, cfg.revision, cfg.trust_remote_code)
            if key not in loaded:
                loaded[key] = load_pretrained(cfg, cache_dir)
            tokenizer, model = loaded[key]
            members.append(Member(cfg.name, tokenizer, model, chat_template=cfg.chat_template))
        return cls(members)

    def decode(
        self, prompt: str, *, method="adafuse", stop=(), max_new_tokens: int = 64, trace: bool = False, **options
    ) -> Generation:
        """Decode one prompt. `method` is a registered name (options are its knobs) or a method config object."""
        if isinstance(method, str):
            spec = METHODS[method]
            cfg = spec.config(**options)
        else:
            spec = next((s for s in METHODS.values() if isinstance(method, s.config)), None)
            if spec is None:
                raise TypeError(f"{type(method).__name__} is not the config of a registered method")
            cfg = type(method)(**{**asdict(method), **options})
        return spec.generate(self.members, prompt, cfg, stop=tuple(stop), max_new_tokens=max_new_tokens, trace=trace)
