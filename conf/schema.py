"""Schemas of the Hydra config, registered in the ConfigStore as `base_*`; the values live in YAML.

Unknown keys fail at compose time; range checks (tau >= 0, M, B >= 1, ...) run when `to_object`
builds the engine's dataclasses, before any model loads.
"""

from dataclasses import dataclass, field, make_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from adafuse.config import ModelConfig
from adafuse.methods import METHODS


@dataclass
class ModelPairConf:
    name: str = MISSING
    members: dict[str, ModelConfig] = field(default_factory=dict)  # decoding order = key order


@dataclass
class TaskConf:
    name: str = MISSING
    version: int = 1
    # Where the scored examples and the few-shot exemplars come from: {hub|local|paper: reader spec}.
    eval: dict[str, Any] = field(default_factory=dict)
    fewshot: dict[str, Any] = field(default_factory=dict)
    num_fewshot: int = 0
    fewshot_seed: int = 1234  # exemplars: a seeded sample of the few-shot pool, the same for every example
    instruction: str = ""
    shot: str = ""  # template of one exemplar
    query: str = MISSING  # template of the example being decoded
    stop: list[str] = field(default_factory=list)
    max_new_tokens: int = 32
    extract: list[str] = field(default_factory=lambda: ["strip"])
    metrics: dict[str, str] = field(default_factory=dict)  # reported name -> registered metric
    limit: int | None = None  # score the first N examples of the canonical order
    prompt_file: str | None = None  # the paper's prompt file: its text + paper_query replace our prompt
    paper_query: str | None = None
    path: str | None = None  # task=custom: the JSONL file of prompts


@dataclass
class DataConf:
    # A folder in ../shared/data's layout; null: the Hugging Face hub; auto: $ADAFUSE_DATA_DIR, else
    # ../shared/data beside the checkout, else the hub.
    dir: str | None = "auto"
    variant: str = "canonical"  # or "paper": the paper's exact evaluation subsets (needs dir)


@dataclass
class WandbConf:
    mode: str = "offline"  # offline (sync later with `wandb sync`), online, or disabled
    project: str = "adafuse"
    entity: str | None = None


@dataclass
class RunConf:
    model_pair: ModelPairConf = MISSING
    method: Any = MISSING
    task: TaskConf = MISSING
    data: DataConf = field(default_factory=DataConf)
    wandb: WandbConf = field(default_factory=WandbConf)
    trace: bool = False  # record each round's pool and scores (spec §7) in predictions.jsonl
    cache_dir: str | None = None  # converted-model cache; null: $ADAFUSE_CACHE or ~/.cache/adafuse
    threads: int | None = None  # torch CPU threads; null: torch's default
    # Examples decoded at once (adafuse/batching.py): their forward passes are merged per model. 8 is
    # the best measured on the bundled pair on 2 CPU cores (README, Speed); on an A100 with an 8B pair,
    # 16-32 (the scheduler splits a pass that would not fit in free memory).
    batch_size: int = 8
    progress: bool = True


def method_schema(name: str) -> type:
    """The method's knobs dataclass plus its `name`: the registry key is the one place a name is written."""
    return make_dataclass(f"{name}_method", [("name", str, field(default=name))], bases=(METHODS[name].config,))


def register() -> None:
    store = ConfigStore.instance()
    store.store(name="base_config", node=RunConf)
    store.store(group="model", name="base_model", node=ModelConfig)
    store.store(group="model_pair", name="base_model_pair", node=ModelPairConf)
    for name in METHODS:
        store.store(group="method", name=f"base_{name}", node=method_schema(name))
    store.store(group="task", name="base_task", node=TaskConf)
