"""Every decoding method of this project as an lm-evaluation-harness model, `adafuse` (docs/lm_eval.md).

    adafuse-lm-eval --model adafuse --model_args pair=tiny,method=adafuse,tau=0.7 --tasks ... --batch_size 8

The model is built from the runner's configuration (conf/): a model pair by name (`pair=tiny`) or a list
of conf/model names (`models=smollm2_135m+gemma3_270m`), a method by name with its knobs as further
arguments, and the runner's `cache_dir`, `threads` and `batch_exact`; lm_eval's `batch_size` is the
number of examples in flight. `generate_until` decodes with the method through the runner's scheduler;
`loglikelihood` and `loglikelihood_rolling` score strings as a product of the members' experts
(adafuse/methods/scoring.py).

lm_eval 0.4.13 finds no external model by itself, and a model registered before `lm_eval.models` is
imported hides the built-in ones (their lazy registration runs only into an empty registry), so this
module imports `lm_eval.models` first. `main` is the `adafuse-lm-eval` command: lm_eval's own command
line with this model registered. Newer lm_eval versions read the `lm_eval.models` entry point instead.
"""

import dataclasses
import logging

import lm_eval.models  # noqa: F401  (registers the built-in models first: see the module doc)
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import model_registry
from tqdm import tqdm

from adafuse import DEFAULT_BATCH_SIZE, Request, through_last_blank_line
from adafuse.errors import ConfigError
from adafuse.methods import METHODS
from eval.runner import load_ensemble, model_configs

log = logging.getLogger(__name__)

# Generation arguments that change nothing under greedy decoding when sampling is off (lm_eval's `hf`
# model drops them then too).
SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p")


class AdaFuseLM(LM):
    def __init__(
        self,
        method: str = "adafuse",
        pair: str | None = None,
        models: str | None = None,
        batch_size: int | str = DEFAULT_BATCH_SIZE,
        batch_exact: bool = True,
        cache_dir: str | None = None,
        threads: int | None = None,
        device: str | None = None,
        max_batch_size: int | None = None,
        **knobs,
    ):
        """`pair` (a conf/model_pair name, default tiny) or `models` (conf/model names joined by '+');
        `knobs`: the method's settings (adafuse/config.py, baselines/), checked against its dataclass.
        `device` (lm_eval's --device, whose default is cuda) overrides every model's where torch can use it
        (as lm_eval's `hf` model, which falls back likewise): see `on_device`; `max_batch_size` (lm_eval's) is
        unused."""
        super().__init__()
        spec = METHODS[method]  # an unknown name lists the registered methods
        valid = {f.name for f in dataclasses.fields(spec.config)}
        unknown = sorted(set(knobs) - valid)
        if unknown:
            raise ConfigError(
                f"method {method!r} has no setting {', '.join(map(repr, unknown))}; its settings: "
                f"{', '.join(sorted(valid)) or '(none)'}; the model's own: pair, models, batch_size, "
                "batch_exact, cache_dir, threads, device"
            )
        self.method = spec.config(**knobs)
        configs = model_configs(pair, models)
        if device is not None and _usable(device):
            configs = on_device(configs, device)
        self.batch_size = _batch_size(batch_size)
        self.batch_exact = bool(batch_exact)
        if threads:
            torch.set_num_threads(int(threads))
        # The runner's loader: members already loaded in this process (by a run or an earlier model) are reused.
        self.ensemble = load_ensemble(configs, spec.members_used(self.method, len(configs)), cache_dir)

    # ---- generation -----------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each request decoded by the method with its stop strings and token budget, `batch_size` examples in
        flight; texts in the order of `requests`."""
        decoded = [_request(*r.args) for r in requests]
        stream = self.ensemble.decode_stream(
            enumerate(decoded),
            batch_size=self.batch_size,
            method=self.method,
            exact=self.batch_exact,
        )
        texts: list[str | None] = [None] * len(decoded)
        for i, gen in tqdm(stream, total=len(decoded), disable=disable_tqdm, desc="adafuse generate_until"):
            texts[i] = gen.text
            self.cache_hook.add_partial("generate_until", requests[i].args, gen.text)
        return texts

    # ---- scoring --------------------------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        scores = self.ensemble.loglikelihood([tuple(r.args) for r in requests])
        results = [(s.logprob, s.greedy) for s in scores]
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        scores = self.ensemble.loglikelihood_rolling([r.args[0] for r in requests])
        results = [s.logprob for s in scores]
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, result)
        return results


def on_device(configs: list, device: str) -> list:
    """The pair placed by lm_eval's --device as run.py places it: a device type alone (`cuda`, lm_eval's default)
    puts member k on the k-th visible GPU, as `device: auto` does; a device with its index (`cuda:1`) or the CPU puts
    every member there."""
    kind = torch.device(device)
    placed = "auto" if kind.type == "cuda" and kind.index is None else device
    return [dataclasses.replace(c, device=placed) for c in configs]


def _usable(device: str) -> bool:
    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        log.warning("device %s is not available here; every model keeps its own device setting", device)
        return False
    return True


def _batch_size(value) -> int:
    if value == "auto":
        return DEFAULT_BATCH_SIZE
    try:
        size = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"batch_size must be a positive integer or 'auto', got {value!r}") from None
    if size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {size}")
    return size


def _request(context: str, gen_kwargs: dict) -> Request:
    """lm_eval's (context, generation arguments) as our Request; anything but greedy decoding is refused."""
    options = dict(gen_kwargs)
    sampling = options.pop("do_sample", False)
    if sampling:
        raise ConfigError(
            "do_sample=True asks for sampling, but every method here decodes greedily (AdaFuse's word "
            "choice is deterministic); set do_sample: false in the task's generation_kwargs"
        )
    temperature = options.get("temperature", 0.0)
    if temperature and "do_sample" not in gen_kwargs:
        raise ConfigError(
            f"temperature={temperature} asks for sampling, but every method here decodes greedily; set "
            "temperature: 0 (or do_sample: false) in the task's generation_kwargs"
        )
    for name in SAMPLING_ONLY:
        options.pop(name, None)
    until = options.pop("until", None)
    budget = options.pop("max_gen_toks", 256)
    if options:
        raise ConfigError(
            f"generation argument(s) {', '.join(sorted(options))} are not supported: the methods here take "
            "until, max_gen_toks and greedy decoding only"
        )
    stop = [until] if isinstance(until, str) else (until or ())
    # lm_eval joins a task's description, exemplars and query with blank lines (its fewshot_delimiter): that
    # much of the context is what the task's requests share, read once (Request.prefix), and for the tasks
    # eval/lm_tasks.py writes it is the runner's prefix (`Task.prefix`)
    return Request(context, stop=stop, max_new_tokens=budget, prefix=through_last_blank_line(context))


def register() -> None:
    """Make `--model adafuse` known to lm_eval (a no-op where an entry point registered it already)."""
    if "adafuse" not in model_registry:
        model_registry.register("adafuse")(AdaFuseLM)


register()


def main() -> None:
    """`adafuse-lm-eval`: lm_eval's command line, with the same arguments, and `--model adafuse` known."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
