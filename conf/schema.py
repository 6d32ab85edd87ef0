"""Schemas of the Hydra config, registered in the ConfigStore's `schema` group; the values live in YAML.

Each option extends its schema with `- /schema/<group>@_here_` in its defaults list. The schemas live
in a group of their own so that an unknown option (`task=nope`) lists only real options.

Unknown keys fail at compose time; range checks (tau >= 0, M, B >= 1, ...) run when `to_object`
builds the engine's dataclasses, before any model loads.
"""

import codecs
import hashlib
import os
import re
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from adafuse import DEFAULT_BATCH_SIZE
from adafuse.config import ModelConfig
from adafuse.errors import ConfigError
from adafuse.methods import METHODS

# Settings that cannot change a prediction: left out of the run id (so a run grows, shards and moves
# in place), and free to differ when a run resumes (eval/results.py). Every other setting is in
# the run id or the run directory's path, and a resume that changes it is refused.
CANNOT_CHANGE_PREDICTIONS = (
    "task.limit",
    "task.shard",
    "task.num_shards",
    "data.dir",
    "cache_dir",
    "threads",
    "batch_size",
    "batch_side_by_side",
    "progress",
    "results_dir",
    "wandb.mode",
    "wandb.project",
    "wandb.entity",
)
# The run directory's path names these already (<results_dir>/<task>/<method>/<model_pair>/<run_id>).
IN_THE_PATH = ("model_pair", "method", "task")


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
    limit: int | None = None  # score the first N examples of the canonical order; not in the run id
    num_shards: int = 1  # this process decodes every num_shards-th example, starting at `shard`,
    shard: int = 0  # into the same run directory as the other shards
    prompt_file: str | None = None  # the paper's prompt file: its text + paper_query replace our prompt
    paper_query: str | None = None
    # The task's prompt file in the paper's runs, relative to data.dir: protocol=paper makes it prompt_file.
    paper_prompt_file: str | None = None
    path: str | None = None  # task=custom: the JSONL file of prompts

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ConfigError(f"task.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_shards < 1 or not 0 <= self.shard < self.num_shards:
            raise ConfigError(
                f"task.shard must be in [0, task.num_shards) with num_shards >= 1, "
                f"got shard={self.shard}, num_shards={self.num_shards}"
            )
        # `task.stop='["\n"]'` on a command line reaches Hydra as a backslash and an n, which Hydra keeps.
        self.stop = [unescape(s) for s in self.stop]
        if "" in self.stop:
            raise ConfigError(
                "task.stop holds an empty string, which would end every generation before its first word; "
                "remove it (task.stop=[] for no stop string)"
            )


# The escapes a stop string may hold, as a Python string literal reads them; any other backslash is refused
# rather than kept as a backslash, which would stop at text no one meant.
_ESCAPE = re.compile(r"\\(?:[ntr\\]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})|\\(.?)", re.DOTALL)
ESCAPES = r"\n, \r, \t, \\, \xHH, \uHHHH and \UHHHHHHHH"


def unescape(text: str) -> str:
    r"""Read the escapes of ESCAPES as a Python string literal does; YAML's double-quoted "\n" arrives already a
    newline. Any other backslash sequence is a ConfigError that lists them."""

    def escape(match: re.Match) -> str:
        if match[1] is None:
            try:
                return codecs.decode(match[0], "unicode_escape")
            except UnicodeDecodeError:  # \U beyond U+10FFFF
                pass
        raise ConfigError(f"task.stop: {match[0]} is not an escape a stop string reads; it reads {ESCAPES}")

    return _ESCAPE.sub(escape, text)


@dataclass
class DataConf:
    # A folder in ../shared/data's layout; null: the Hugging Face hub; auto: $ADAFUSE_DATA_DIR, else
    # ../shared/data beside the checkout, else the hub.
    dir: str | None = "auto"
    variant: str = "canonical"  # or "paper": the paper's exact evaluation subsets (needs dir)


WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class WandbConf:
    mode: str = "offline"  # offline (sync later with `wandb sync`), online, or disabled
    project: str = "adafuse"
    entity: str | None = None

    def __post_init__(self):
        if self.mode not in WANDB_MODES:
            raise ConfigError(f"wandb.mode must be one of {', '.join(WANDB_MODES)}, got {self.mode!r}")


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
    # Examples decoded at once (adafuse/engine/loop.py): their forward passes are merged per model. The
    # default is the measured best on the bundled pair (docs/speed.md, "Batching across examples");
    # lower it if a pass cannot fit (BatchMemoryError).
    batch_size: int = DEFAULT_BATCH_SIZE
    # Merged passes compute every example exactly as alone, so batch_size changes no output (docs/speed.md,
    # "Exact batching"). false merges linear layers across examples where that changes their last bits (fast,
    # float32 on a CPU): batch_size then joins the run id, and a run resumes only at its own size.
    batch_exact: bool = True
    # An example's models run their passes side by side, each on its share of the cores (adafuse/backend/cpu/cores.py).
    # false: one model's passes after the other's, each on every core; outputs are the same (docs/speed.md).
    batch_side_by_side: bool = True
    progress: bool = True
    results_dir: str = "results"  # runs write to <results_dir>/<task>/<method>/<model_pair>/<run_id>
    # Set by the `protocol` group (conf/protocol/): none, or paper (the paper's files, prompts, decoder and
    # scorers). Choose it as `protocol=paper`, never `protocol: ...` in a config, so that it is in the run id.
    protocol: str = "none"

    def __post_init__(self):
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1 (or null for torch's default), got {self.threads}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")


PAIRS = Path(__file__).resolve().parent / "model_pair"


def check_pair_name(name: str, chosen: str | None) -> None:
    """ConfigError if the pair chosen as `model_pair=<chosen>` names itself after another pair of conf/model_pair (a
    copied file whose `name:` was left as it was): its runs would write into that pair's folders,
    results/<task>/<method>/<name>/, and resume or refuse that pair's runs as their own. A name of its own, or the
    name of the pair it is (`model_pair.name=...` renames a pair's runs), passes."""
    if chosen is None or name == chosen or not (PAIRS / f"{name}.yaml").is_file():
        return
    raise ConfigError(
        f"model_pair={chosen} is named {name!r}, the name of conf/model_pair/{name}.yaml: its runs would write into "
        f"that pair's results (results/<task>/<method>/{name}/). Give it a name of its own, e.g. name: {chosen} in "
        f"its file, or model_pair.name=... on the command line"
    )


def method_schema(name: str) -> type:
    """The method's knobs dataclass plus its `name`: the registry key is the one place a name is written."""
    return make_dataclass(f"{name}_method", [("name", str, field(default=name))], bases=(METHODS[name].config,))


_registered = False


RUN_ID_BYTES = 200  # a file name holds 255 bytes; a longer run id keeps its start and a digest of the whole


def run_id(override_dirname: str, batch_exact: bool = True, batch_size: int = DEFAULT_BATCH_SIZE) -> str:
    """The run directory's last part: the overrides that can change predictions, or 'default'. Without
    exact batching, the batch size is one of them. One too long for a file name (models given by absolute
    paths) keeps its first characters and a digest of all of it: still one name per set of overrides."""
    if not batch_exact:
        override_dirname = ",".join(filter(None, [override_dirname, f"batch_size={batch_size}"]))
    name = override_dirname.replace("/", "%") if override_dirname else "default"
    if len(name.encode()) <= RUN_ID_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    start = name.encode()[: RUN_ID_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{start}~{digest}"


def resumable_settings(config: dict) -> set[str]:
    """The settings a run may change when it resumes: batch_size only if its passes are batch-invariant: batching
    is exact, and no model's passes were recorded as batch-dependent (config.yaml's runtime: a GPU whose kernels
    keep no row's bits, adafuse/backend/cuda/choice.py)."""
    return set(CANNOT_CHANGE_PREDICTIONS) - (set() if batch_invariant(config) else {"batch_size"})


def batch_invariant(config: dict) -> bool:
    """Do a run's outputs not depend on its batch size (see `resumable_settings`)?"""
    models = (config.get("runtime") or {}).get("models") or []
    recorded = all((m.get("passes") or {}).get("batch_invariant", True) for m in models)
    return bool(config.get("batch_exact", True)) and recorded


def register() -> None:
    """The schemas in Hydra's ConfigStore and the resolvers conf/config.yaml uses (once per process)."""
    global _registered
    if _registered:
        return
    _registered = True
    OmegaConf.register_new_resolver("run_id", run_id, replace=True)
    OmegaConf.register_new_resolver("not_in_run_id", lambda: [*IN_THE_PATH, *CANNOT_CHANGE_PREDICTIONS], replace=True)
    # A sweep job's directory: the run directory, relative to where the sweep was started unless absolute.
    OmegaConf.register_new_resolver("join_path", os.path.join, replace=True)
    store = ConfigStore.instance()
    store.store(name="base_config", node=RunConf)
    store.store(group="schema", name="model", node=ModelConfig)
    store.store(group="schema", name="model_pair", node=ModelPairConf)
    store.store(group="schema", name="task", node=TaskConf)
    for name in METHODS:
        store.store(group="schema/method", name=name, node=method_schema(name))


def typed(plain: dict) -> DictConfig:
    """A plain copy of a run's config typed by the schemas, its method's by name from the store; a key that no
    schema declares is a ConfigError naming it and the keys beside it. Hydra's `+key=value` adds a key that
    struct mode refuses otherwise, and `OmegaConf.to_object` would carry it along unread. Needs `register()`."""
    method = ConfigStore.instance().load(f"schema/method/{plain['method']['name']}.yaml").node
    try:
        return OmegaConf.merge(OmegaConf.structured(RunConf), {"method": method}, plain)
    except ConfigKeyError as err:
        parent, _, _ = err.full_key.rpartition(".")
        valid = ", ".join(f.name for f in fields(err.object_type)) if err.object_type else "none"
        raise ConfigError(
            f"{err.full_key} is not a setting (a key added with + too must be one); "
            f"{parent or 'the top level'} has: {valid}"
        ) from None


def check_known_keys(cfg: DictConfig) -> None:
    """Raise ConfigError if the composed config holds a key that its schemas do not declare (see `typed`)."""
    typed(OmegaConf.to_container(cfg))


def saved_config(path) -> DictConfig:
    """A run's config.yaml (a plain copy of its composed config) typed again by the schemas, as if
    composed. Its `source` and `runtime` records (what it read, where it was decoded: eval/results.py) are not
    settings and are left out. Needs `register()` first."""
    saved = OmegaConf.to_container(OmegaConf.load(path))
    saved.pop("source", None)
    saved.pop("runtime", None)
    return typed(saved)
