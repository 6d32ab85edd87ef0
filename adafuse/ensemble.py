"""The Python API: load an ensemble once, decode prompts with any registered method.

from adafuse import Ensemble
ens = Ensemble.from_config(["smollm2_135m", "gemma3_270m"])
gen = ens.decode("Question: What is the capital of France?\\nAnswer:", stop=["\\n"], max_new_tokens=16)
gen.text, gen.stats, gen.trace
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import yaml

from adafuse.config import ModelConfig
from adafuse.engine.executor import Executor
from adafuse.engine.loop import DEFAULT_BATCH_SIZE, Engine, drive, run_engine
from adafuse.engine.scheduler import Scheduler
from adafuse.errors import ConfigError, UnknownNameError
from adafuse.loading.pretrained import load_pretrained, member_device, placement
from adafuse.member.member import Member
from adafuse.member.passes import Program
from adafuse.methods import METHODS, Method
from adafuse.methods.scoring import Likelihood, loglikelihood, loglikelihood_rolling
from adafuse.methods.session import Request
from adafuse.text.prompt_check import PromptCheck
from adafuse.trace import Generation

MODEL_CONFIGS = Path(__file__).resolve().parent.parent / "conf" / "model"


def model_config(entry) -> ModelConfig:
    """A ModelConfig from a ModelConfig, a dict, or the name of a file in conf/model/."""
    if isinstance(entry, ModelConfig):
        return entry
    if isinstance(entry, str):
        if not MODEL_CONFIGS.is_dir():
            raise ConfigError(
                f"model {entry!r}: the model configs are not at {MODEL_CONFIGS} (an install without conf/?); "
                "reinstall the project, or pass a ModelConfig"
            )
        path = MODEL_CONFIGS / f"{entry}.yaml"
        if not path.is_file():
            raise UnknownNameError("model", entry, [p.stem for p in MODEL_CONFIGS.glob("*.yaml")])
        entry = yaml.safe_load(path.read_text())
        entry.pop("defaults", None)  # Hydra's composition list, not a setting
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(set(dict(entry)) - known)
    if unknown:
        raise ConfigError(
            f"model {dict(entry).get('name')!r}: unknown setting(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(known))}"
        )
    return ModelConfig(**dict(entry))


@dataclass(frozen=True)
class Job:
    """One example for an engine its caller steps (`Ensemble.engine`): the request, the method and its
    config (`resolve_method`), and who hears the generated text as it becomes final (`Session`)."""

    request: Request
    method: Method
    config: object
    on_text: Callable[[str], None] | None = None

    def program(self, members: list) -> Program:
        return self.method.generate(members, self.request, self.config, self.on_text)


@dataclass(frozen=True)
class ScoreJob:
    """Log-likelihoods for an engine its caller steps: each (context, continuation) of `pairs`, scored by the
    loaded members (adafuse/methods/scoring.py); its result is the list of `Likelihood`s, in order."""

    pairs: tuple[tuple[str, str], ...]

    def program(self, members: list) -> Program:
        return loglikelihood([m for m in members if m is not None], self.pairs)


class Ensemble:
    def __init__(self, members: list[Member]):
        if not members:
            raise ValueError("an ensemble needs at least one model")
        self.members = members

    @classmethod
    def from_config(cls, models, cache_dir=None, load=None) -> "Ensemble":
        """Load each model once; a model listed twice on one device gets two members that share its weights.

        `load` (indices) loads only those models; the others stay None (a method such as `single`
        that decodes with some of the pair's models keeps its indices into the whole pair).
        """
        configs = cls.placed(models)
        load = range(len(configs)) if load is None else set(load)
        loaded = {}
        members = []
        for i, cfg in enumerate(configs):
            if i not in load:
                members.append(None)
                continue
            key = (cfg.path, cfg.bundle, cfg.dtype, cfg.device, cfg.revision, cfg.trust_remote_code)
            if key not in loaded:
                loaded[key] = load_pretrained(cfg, cache_dir)
            tokenizer, model = loaded[key]
            members.append(Member(cfg.name, tokenizer, model, chat_template=cfg.chat_template))
        return cls(members)

    @classmethod
    def joined(cls, parts: list["Ensemble | None"]) -> "Ensemble":
        """One ensemble of the members of `parts`, in order; a None part holds one model's place unloaded
        (as `from_config(..., load=...)` does), so that models loaded separately decode together."""
        return cls([member for part in parts for member in ([None] if part is None else part.members)])

    @staticmethod
    def placed(models) -> list[ModelConfig]:
        """The models' configs with each member's device resolved: `device: auto` puts member k on the k-th visible
        GPU (cycling), else on the CPU; a named device stays (adafuse/loading/pretrained.py `member_device`)."""
        return [replace(cfg, device=member_device(cfg, k)) for k, cfg in enumerate(map(model_config, models))]

    @staticmethod
    def placement(models) -> list[dict[str, str]]:
        """Where `from_config` puts each model's weights, resolved ("auto" is never an answer); loads nothing.

        Per model: {"device": "cpu" | "cuda:0" | ..., "dtype": "float32" | "bfloat16" | ..., "gpu": the
        GPU's name, or None on the CPU}: a GPU's kernels, like the dtype, decide an output's last bits."""
        places = []
        for cfg in Ensemble.placed(models):
            device, dtype = placement(cfg)
            gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
            places.append({"device": str(device), "dtype": str(dtype).removeprefix("torch."), "gpu": gpu})
        return places

    def check_prompts_fit(self, prompts: list[str], reserve: int) -> None:
        """Raise ContextLengthError (or DataError for an empty prompt) before decoding if some prompt
        leaves any loaded model fewer than `reserve` positions of its context."""
        for prompt in prompts:
            self.prompt_lengths(prompt, reserve)

    def prompt_lengths(self, prompt: str, reserve: int = 0) -> list[int | None]:
        """Each model's count of the prompt's tokens as it reads them (None where it is not loaded); raises
        as `check_prompts_fit` does."""
        return [None if m is None else len(m.prompt_ids(prompt, reserve)) for m in self.members]

    def prompt_check(self) -> PromptCheck:
        """`prompt_lengths` for another thread than the one that decodes (a server's): its own copies of the loaded
        models' tokenizers, and a refusal without tokenizing for a prompt longer in bytes than a model's context
        can hold (adafuse/text/prompt_check.py)."""
        return PromptCheck(self.members)

    def passes(self, exact: bool = True) -> list[dict | None]:
        """How each loaded model's passes run (None where it is not loaded), as its backend says: the backend,
        whether they are batch-invariant with `exact` asked and which op types fail to be, how each op type runs
        (adafuse/backend/interface.py `Backend.describe`). A run records it (config.yaml's runtime)."""
        return [None if m is None else m.runner.describe(exact) for m in self.members]

    def without_utf8_rule(self) -> list[str]:
        """The loaded models whose vocabulary is of a type adafuse/text/tokens.py does not know, so that the rule
        keeping words valid UTF-8 is off for them (a run records it in its runtime)."""
        return [m.name for m in filter(None, self.members) if m.tokenisation.tokens.kind is None]

    def decode(self, prompt: str | Request, *, method="adafuse", **options) -> Generation:
        """Decode one prompt. `method` is a registered name (options are its knobs) or a method config object.

        The request's settings (`stop`: one stop string or a list, `max_new_tokens`, `trace`) are given
        here as keywords too, or in a `Request` passed as `prompt`.
        """
        options, settings = _split_request_fields(options)
        spec, cfg = resolve_method(method, options)
        return drive(
            spec.generate(self.members, _fitting(self.members, spec, cfg, Request.of(prompt, **settings)), cfg)
        )

    def decode_stream(
        self,
        items: Iterable[tuple[object, str | Request]],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        method="adafuse",
        exact: bool = True,
        side_by_side: bool = True,
        executor: Executor | None = None,
        scheduler: Scheduler | None = None,
        **options,
    ) -> "DecodeStream":
        """Decode (key, prompt or Request) items with `batch_size` examples in flight (adafuse/engine/loop.py);
        iterating yields (key, Generation) as each finishes. With `exact` (the default) every forward pass
        has the bits it has in `decode`, and so every output (adafuse/backend/cpu/tiles.py); without, up to
        rounding. `side_by_side=False` runs one model's passes after the other's on the CPU, each on every
        core (the same outputs). Request settings given as keywords apply to every item that is a plain
        prompt. `executor` and `scheduler` (adafuse/engine/) replace the default ones (a memory budget per pass:
        `Scheduler(memory_budget=...)`)."""
        options, settings = _split_request_fields(options)
        spec, cfg = resolve_method(method, options)
        executor = executor or Executor(exact, cpu_options(side_by_side))
        return self._stream(items, spec, cfg, settings, batch_size, executor, scheduler)

    def _stream(
        self, items, spec: Method, cfg, settings: dict, batch_size: int, executor: Executor, scheduler=None
    ) -> "DecodeStream":
        def one(members, item):
            return spec.generate(members, _fitting(members, spec, cfg, Request.of(item[1], **settings)), cfg)

        engine = Engine(self.members, one, batch_size, executor, scheduler)
        return DecodeStream(run_engine(engine, items), engine)

    def engine(self, *, batch_size: int = DEFAULT_BATCH_SIZE, exact: bool = True, side_by_side: bool = True) -> Engine:
        """The engine loop itself (adafuse/engine/loop.py), for a caller that steps it (a server: serve/):
        `submit(key, job)` (a `Job`, or a `ScoreJob`) from the thread that calls `step()`, which returns (key,
        result) for each job that finished: a Generation, or a ScoreJob's likelihoods. Unlike `decode_stream`, a
        job that fails ends alone: its result is its exception, and the others go on. Every example has the
        bits it has in `decode`, as in `decode_stream`, whatever else is in flight."""

        def one(members, job: Job | ScoreJob) -> Program:
            return _failure_as_result(job.program(members))

        return Engine(self.members, one, batch_size, Executor(exact, cpu_options(side_by_side)))

    def decode_batch(self, prompts: list[str | Request], *, method="adafuse", **kwargs) -> list[Generation]:
        """`decode` for many prompts, batched across examples; results in the order of `prompts`. Every prompt
        is checked to fit before any is decoded."""
        batch_size = kwargs.pop("batch_size", DEFAULT_BATCH_SIZE)
        exact, side_by_side = kwargs.pop("exact", True), kwargs.pop("side_by_side", True)
        executor = kwargs.pop("executor", None) or Executor(exact, cpu_options(side_by_side))
        scheduler = kwargs.pop("scheduler", None)
        options, settings = _split_request_fields(kwargs)
        spec, cfg = resolve_method(method, options)
        requests = [_fitting(self.members, spec, cfg, Request.of(p, **settings)) for p in prompts]
        done = dict(self._stream(enumerate(requests), spec, cfg, {}, batch_size, executor, scheduler))
        return [done[i] for i in range(len(prompts))]

    def loglikelihood(self, requests: list[tuple[str, str]]) -> list[Likelihood]:
        """Each (context, continuation)'s log-probability: the mean over the loaded members, each in its own
        tokenization (adafuse/methods/scoring.py); in input order."""
        return drive(loglikelihood([m for m in self.members if m is not None], requests))

    def loglikelihood_rolling(self, texts: list[str]) -> list[Likelihood]:
        """Each text's log-probability from its start, the mean over the loaded members (adafuse/methods/scoring.py)."""
        return drive(loglikelihood_rolling([m for m in self.members if m is not None], texts))


class DecodeStream:
    """The (key, Generation) pairs of `Ensemble.decode_stream` in the order the examples finish, and
    how their forward passes met so far (`batching`)."""

    def __init__(self, finished: Iterator[tuple[tuple[object, object], Generation]], engine: Engine):
        self._finished = finished  # run_engine's ((key, prompt), Generation) pairs
        self._engine = engine

    def __iter__(self) -> "DecodeStream":
        return self

    def __next__(self) -> tuple[object, Generation]:
        (key, _), gen = next(self._finished)
        return key, gen

    def close(self) -> None:
        """Stop early: the examples in flight are closed, nothing left waiting."""
        self._finished.close()

    @property
    def batching(self) -> dict[str, dict]:
        """Per model name: how its passes ran, their counts and its KV bytes (adafuse/engine/loop.py
        `Engine.report`)."""
        return self._engine.report()


def cpu_options(side_by_side: bool) -> dict:
    """The CPU backend's options (adafuse/backend/cpu/backend.py) for a caller's `side_by_side`: whether different
    models' passes of a step run at once, and torch's thread count for the passes, the calling thread's (a thread
    started later, as a server's engine thread, starts with the process's default, and a kernel's bits may depend
    on it). No other backend reads them."""
    return {"cpu": {"side_by_side": side_by_side, "threads": torch.get_num_threads()}}


def _fitting(members: list[Member], spec, cfg, request: Request) -> Request:
    """`request`, checked to leave every model the method decodes with the context it may need: an over-long
    prompt is a ContextLengthError before any model reads it, not after another model has read it all."""
    reserve = spec.positions_needed(cfg, request.max_new_tokens)
    for k in spec.members_used(cfg, len(members)):
        members[k].prompt_ids(request.prompt, reserve)
    return request


def _failure_as_result(program: Program) -> Program:
    """`program`, with an exception it raises returned as its result (the engine then frees its slot)."""
    try:
        return (yield from program)
    except Exception as err:  # noqa: BLE001 - whatever failed is the example's own answer, given to its caller
        return err


def _split_request_fields(options: dict) -> tuple[dict, dict]:
    """(method knobs, Request fields) out of one set of keyword arguments."""
    names = {f.name for f in fields(Request)} - {"prompt"}
    return {k: v for k, v in options.items() if k not in names}, {k: v for k, v in options.items() if k in names}


def resolve_method(method, options: dict):
    """(registered Method, its config): from a name and knobs, or from a config object (knobs override it)."""
    if isinstance(method, str):
        spec = METHODS[method]
        return spec, spec.config(**options)
    spec = next((s for s in METHODS.values() if isinstance(method, s.config)), None)
    if spec is None:
        raise TypeError(f"{type(method).__name__} is not the config of a registered method")
    return spec, type(method)(**{**asdict(method), **options})
