"""One evaluation run: decode a task's examples with a method, score them, write and log the results.

Order of work (each step can fail with a named error before the next costs anything):
compose -> typed settings and range checks -> task names, data files and prompts -> where each model
will run (device, dtype) -> run directory (writable, same settings and runtime as its predictions)
and this shard's claim -> model files and weights -> context lengths -> decoding (resumable) ->
metrics, once every shard's examples have predictions.

The runner reaches the engine only through its public API (`adafuse.Ensemble` and the config,
error and method registries): tests/unit/test_layers.py holds it there.
"""

import json
import logging
import platform
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from adafuse import Ensemble, Request, model_config
from adafuse.config import ModelConfig
from adafuse.errors import ConfigError, ContextLengthError, ModelFileError, UnknownNameError
from adafuse.methods import METHODS
from conf.compose import compose_run
from conf.schema import batch_invariant, check_known_keys, check_pair_name, saved_config
from eval.data import Example
from eval.hub import describe, hub_commit
from eval.results import RunDir, git_sha
from eval.tasks import Task, resolve_data_dir
from eval.tracking import Tracker

log = logging.getLogger(__name__)

MODEL_PAIRS = Path(__file__).resolve().parent.parent / "conf" / "model_pair"


def settings_of(cfg: DictConfig):
    """The typed settings: every key one the schemas declare, and the dataclasses' __post_init__ checks (tau >= 0,
    B >= 1, ...) run here."""
    check_known_keys(cfg)
    settings = OmegaConf.to_object(cfg)
    if not settings.model_pair.members:
        raise ConfigError(f"model_pair {settings.model_pair.name!r} lists no models")
    return settings


def model_configs(pair: str | None, models: str | None) -> list[ModelConfig]:
    """The models of a pair of conf/model_pair (default tiny), or of conf/model names joined by '+' (as
    `pair=` and `models=` of the lm_eval model and the server take them)."""
    if pair is not None and models is not None:
        raise ConfigError("give either pair=<conf/model_pair name> or models=<name>+<name>, not both")
    if models is not None:
        return [model_config(name) for name in str(models).split("+") if name]
    pair = pair or "tiny"
    if not (MODEL_PAIRS / f"{pair}.yaml").is_file():
        raise UnknownNameError("model pair", pair, [p.stem for p in MODEL_PAIRS.glob("*.yaml")])
    settings = settings_of(compose_run(f"model_pair={pair}"))
    check_pair_name(settings.model_pair.name, pair)
    return list(settings.model_pair.members.values())


def main(cfg: DictConfig, run_dir: Path, admitted: Callable[[], None] | None = None) -> dict | None:
    """Decode this process's shard of the task into `run_dir`; return the metrics once every example of
    the run has a prediction (the last shard to finish writes metrics.json), else None.

    Nothing is written into `run_dir` before the process is admitted: its shard claimed, its settings and
    runtime checked against the run's, its models loaded and its prompts checked to fit. `admitted` is
    called then (run.py writes Hydra's own records of the run)."""
    settings = settings_of(cfg)
    pair, method = Ensemble.placed(settings.model_pair.members.values()), settings.method
    used = METHODS[method.name].members_used(method, len(pair))
    models = [pair[k] for k in used]  # each with its device resolved: member k of the pair on the k-th GPU
    settings.data.dir = resolve_data_dir(settings.data.dir)
    task = Task(settings.task, settings.data)
    shard, num_shards = settings.task.shard, settings.task.num_shards
    mine = task.examples[shard::num_shards]
    prompts = {ex.id: task.prompt(ex) for ex in mine}

    # What the run reads, resolved: the data's files and hub commits, each model's commit or checksum. The models
    # then load at the commits recorded here, whatever their branch says by the time they load.
    source = {"data": task.sources.record(), "models": model_sources(models)}
    pair = pinned(pair, used, source["models"])
    config = {**OmegaConf.to_container(cfg, resolve=True), "source": source, "runtime": runtime_of(models)}
    out = RunDir(run_dir, config)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    busy = any(ex.id not in out.records for ex in mine)
    with out.claim(shard, num_shards) if busy else nullcontext():  # claiming re-reads the predictions
        out.check()  # a resume with other settings or on another device: refused before any model loads
        todo = [ex for ex in mine if ex.id not in out.records]
        if todo:
            ensemble = load_ensemble(pair, used, settings.cache_dir)
            reserve = METHODS[method.name].positions_needed(method, task.cfg.max_new_tokens)
            check_prompts_fit(ensemble, todo, prompts, reserve)
            record_text_rules(config["runtime"], ensemble)
            record_passes(config["runtime"], ensemble, settings.batch_exact)
        out.admit()
        if admitted is not None:
            admitted()
        log.info("%s: %s", task.name, describe_data(task))
        log.info(
            "%s: %d examples; shard %d of %d holds %d: %d already done, %d to decode",
            task.name,
            len(task.examples),
            shard,
            num_shards,
            len(mine),
            len(mine) - len(todo),
            len(todo),
        )
        tracker = Tracker(settings.wandb, run_dir, config)
        if todo:
            done = [out.records[ex.id]["scores"] for ex in mine if ex.id in out.records]
            tracker.resume([{k: v * task.metrics[k].scale for k, v in scores.items()} for scores in done])
            decode_all(ensemble, task, todo, prompts, method, settings, out, tracker)
        out.refresh()  # the other shards' predictions
        metrics = finish(task, out, settings, models)
        tracker.finish(metrics, [out.records[ex.id] for ex in task.examples] if metrics else [])
    return metrics


def check_prompts_fit(ensemble: Ensemble, examples: list[Example], prompts: dict[str, str], reserve: int) -> None:
    """ContextLengthError before any decoding if an example's prompt leaves some model fewer than `reserve`
    positions; the message names the example (and, for a user's own prompts, its file and line)."""
    for example in examples:
        try:
            ensemble.check_prompts_fit([prompts[example.id]], reserve)
        except ContextLengthError as err:
            where = f" ({example.origin})" if example.origin else ""
            raise ContextLengthError(f"example {example.id!r}{where}: {err}") from None


def describe_data(task: Task) -> str:
    """What the task read, for the log: data.dir=auto may have resolved to local files or to the hub."""
    sources = task.sources
    if sources.hub:
        return "read from the Hugging Face hub: " + ", ".join(
            f"{h['dataset']} {h['split']} at {h['commit'][:12]}" for h in sources.hub
        )
    relative = any(not Path(name).is_absolute() for name in sources.files)
    return f"read {', '.join(sources.files)}" + (f" in {sources.local}" if relative else "")


def model_sources(models: list[ModelConfig]) -> list[dict]:
    """What each model's weights are, resolved before any loads: a hub model's commit (its revision, default
    main, as the hub names it now, or as the local hub cache recorded it offline); a GGUF's pinned sha256 (checked
    when it loads); a local folder's path."""
    sources = []
    for cfg in models:
        if cfg.bundle is not None:
            sources.append({"name": cfg.name, "bundle": cfg.bundle, "sha256": cfg.sha256})
        elif cfg.path.endswith(".gguf") or Path(cfg.path).expanduser().exists() or cfg.path.startswith(("/", ".", "~")):
            sources.append({"name": cfg.name, "path": cfg.path, "sha256": cfg.sha256})
        else:
            try:
                commit = hub_commit(cfg.path, cfg.revision, "model")
            except Exception as err:  # the hub's error, said with what to do about it
                what, url = (
                    f"model {cfg.name!r} ({cfg.path}, revision {cfg.revision or 'main'})",
                    f"https://huggingface.co/{cfg.path}",
                )
                where, offline = (
                    "the model's path and revision",
                    "download it where there is, and set the model's path to it",
                )
                raise describe(err, what, url, where, offline, ModelFileError) from err
            sources.append({"name": cfg.name, "hub": cfg.path, "revision": cfg.revision or "main", "commit": commit})
    return sources


def pinned(pair: list[ModelConfig], used: list[int], sources: list[dict]) -> list[ModelConfig]:
    """The pair with each hub model the method uses set to load the commit its source records."""
    pair = list(pair)
    for k, source in zip(used, sources):
        if "commit" in source:
            pair[k] = replace(pair[k], revision=source["commit"])
    return pair


def record_text_rules(runtime: dict, ensemble: Ensemble) -> None:
    """Mark, in config.yaml's runtime, each model whose words the UTF-8 rule does not guard (its vocabulary
    is of no known type): its outputs may hold U+FFFD where another model's would not."""
    off = set(ensemble.without_utf8_rule())
    for model in runtime["models"]:
        if model["name"] in off:
            model["utf8_rule"] = "off"


def record_passes(runtime: dict, ensemble: Ensemble, exact: bool) -> None:
    """Record, in config.yaml's runtime, how each model's passes run (`Ensemble.passes`): where they are not
    batch-invariant (a GPU whose kernels keep no row's bits, or batch_exact=false), the run's outputs depend on
    its batch size, and a resume at another is refused (conf/schema.py `resumable_settings`)."""
    described = [d for d in ensemble.passes(exact) if d is not None]
    for model, passes in zip(runtime["models"], described, strict=True):
        model["passes"] = passes


def decoding_models(settings) -> list[ModelConfig]:
    """The models the method decodes with (`single`: one of the pair)."""
    pair = list(settings.model_pair.members.values())
    return [pair[i] for i in METHODS[settings.method.name].members_used(settings.method, len(pair))]


def runtime_of(models: list[ModelConfig]) -> dict:
    """What this process decodes on, resolved before any weights load: config.yaml's `runtime`, which a
    resume must match (eval/results.py). Each model's device, dtype and GPU, and torch's version."""
    places = Ensemble.placement(models)
    return {"torch": str(torch.__version__), "models": [{"name": m.name, **p} for m, p in zip(models, places)]}


def merge(run_dir: Path) -> dict | None:
    """metrics.json from the predictions that a run's shards wrote (scripts/merge.py); None if some
    examples have none yet (the log names them)."""
    path = Path(run_dir) / "config.yaml"
    cfg = saved_config(path)
    settings = settings_of(cfg)
    models = decoding_models(settings)
    settings.data.dir = resolve_data_dir(settings.data.dir)
    task = Task(settings.task, settings.data)
    saved = yaml.safe_load(path.read_text())
    recorded = {key: saved[key] for key in ("source", "runtime") if saved.get(key)}
    config = OmegaConf.to_container(cfg, resolve=True) | recorded
    return finish(task, RunDir(run_dir, config), settings, models)


def finish(task: Task, out: RunDir, settings, models) -> dict | None:
    """Write metrics.json if every example has a prediction; otherwise say which are missing."""
    missing = [ex.id for ex in task.examples if ex.id not in out.records]
    if missing:
        log.info(
            "%s: %d of %d examples have no prediction yet (%s%s); metrics.json waits for them",
            out.path,
            len(missing),
            len(task.examples),
            ", ".join(missing[:5]),
            ", ..." if len(missing) > 5 else "",
        )
        return None
    records = [out.records[ex.id] for ex in task.examples]
    metrics = summary(task, records, settings, models, out)
    for name, why in task.skipped.items():
        log.warning("%s not computed: %s", name, why)
    out.write_metrics(metrics)
    log.info("%s", {k: round(v, 2) for k, v in metrics["metrics"].items()})
    return metrics


# Models loaded by this process, each as a one-model ensemble, reused by later runs in it: tests and
# in-process sweeps call main() many times, and loading weights is the slow part.
_LOADED: dict[str, Ensemble] = {}


def load_ensemble(pair: list[ModelConfig], used: list[int], cache_dir: str | None) -> Ensemble:
    """The pair's ensemble with the `used` models loaded (None elsewhere); a model already loaded is
    reused, and models outside `pair` are dropped, so that a sweep over model pairs holds one pair in
    memory at a time. A model whose device is "auto" goes where its place in `pair` says (`Ensemble.placed`),
    though each loads on its own."""
    pair = Ensemble.placed(pair)
    keys = [_model_key(pair, k, cache_dir) for k in range(len(pair))]
    for key in set(_LOADED) - set(keys):
        del _LOADED[key]
    for k in used:
        if keys[k] not in _LOADED:
            _LOADED[keys[k]] = Ensemble.from_config([pair[k]], cache_dir)
    return Ensemble.joined([_LOADED[keys[k]] if k in used else None for k in range(len(pair))])


def _model_key(models: list[ModelConfig], k: int, cache_dir: str | None) -> str:
    # A model listed twice needs two members (a member holds its decoding state): count earlier copies.
    return json.dumps([asdict(models[k]), cache_dir, models[:k].count(models[k])], sort_keys=True)


def decode_all(ensemble, task, todo, prompts, method, settings, out: RunDir, tracker) -> None:
    """Decode `todo` with `settings.batch_size` examples in flight; each is written as soon as it finishes."""
    primary = task.primary_metric(settings.protocol == "paper")
    scale = task.metrics[primary].scale if primary else 1.0
    done = [r["scores"][primary] for r in out.records.values() if primary in r["scores"]]
    bar = tqdm(total=len(todo), desc=f"{task.name} {method.name}", unit="ex", disable=not settings.progress)
    requests = (
        (ex, Request(prompts[ex.id], task.cfg.stop, task.cfg.max_new_tokens, settings.trace, task.prefix))
        for ex in todo
    )
    stream = ensemble.decode_stream(
        requests,
        batch_size=settings.batch_size,
        method=method,
        exact=settings.batch_exact,
        side_by_side=settings.batch_side_by_side,
    )
    # With several examples in flight an example's own seconds overlap the others'; what a run costs is
    # the wall time between finishes, which sums to this process's decoding time at any batch size.
    last_finish = time.perf_counter()
    for example, gen in stream:
        previous_finish, last_finish = last_finish, time.perf_counter()
        answer, scores = task.score(example, gen.text)
        record = {
            "id": example.id,
            "prompt": prompts[example.id],
            "prediction": gen.text,
            "answer": answer,
            "references": example.references,
            "scores": scores,
            "stats": {**asdict(gen.stats), "run_seconds": last_finish - previous_finish},
        }
        if gen.trace is not None:
            record["trace"] = asdict(gen.trace)
        out.append(record)
        bar.update()
        if primary in scores:
            done.append(scores[primary])
            bar.set_postfix({primary: f"{scale * sum(done) / len(done):.1f}"})
        tracker.log_example(len(out.records), {k: v * task.metrics[k].scale for k, v in scores.items()}, gen.stats)
    bar.close()
    batching = stream.batching
    for name, how in batching.items():
        log.info(
            "batching, %s: attention %s, linear layers %s; %d passes, %d merged (%d prompts read in them), %d rows, "
            "%.1f s; KV held at most %.0f MiB, %.0f MiB per example in flight, prompt prefixes %.0f MiB",
            *(name, how["attention"], how["linear"], how["passes"], how["merged_passes"], how["merged_prompts"]),
            *(how["rows"], how["seconds"], how["kv_peak_bytes"] / 2**20, how["kv_peak_bytes_per_example"] / 2**20),
            how["kv_prefix_bytes"] / 2**20,
        )
    out.append_batching(settings.task.shard, len(todo), batching)


def summary(task: Task, records: list[dict], settings, models, out: RunDir) -> dict:
    """metrics.json: what was run and where, every metric, throughput, and how the examples' passes met."""
    stats = [r["stats"] for r in records]
    seconds = sum(s.get("run_seconds", s["seconds"]) for s in stats)  # records from before run_seconds: their own
    rounds = sum(s["rounds"] for s in stats)
    words = [w for s in stats for w in s["words_per_round"]]
    return {
        "task": task.name,
        "task_version": task.cfg.version,
        "variant": settings.data.variant,
        "protocol": settings.protocol,  # paper: the paper's files, prompts and scorers (its paper_* metrics)
        "data_dir": settings.data.dir,  # None: the Hugging Face hub
        "method": asdict(settings.method),
        "model_pair": settings.model_pair.name,
        "models": [m.name for m in models],
        "n": len(records),
        "limit": task.cfg.limit,
        # Per model, summed over the processes that decoded (batching.jsonl): how requests met ("attention":
        # per_request or alone; "linear": row_tiles or stock) and "passes", "merged_passes", "rows",
        # "merged_prompts", "prefix_passes", "seconds" (its passes' time), and the most KV any process held.
        "batching": {
            "batch_size": settings.batch_size,
            "exact": settings.batch_exact,
            # the outputs do not depend on batch_size: exact, and every model's passes invariant where it ran
            "batch_invariant": batch_invariant(out.config),
            "side_by_side": settings.batch_side_by_side,
            "models": out.batching(),
        },
        # config.yaml's: the data's files (sha256) or hub splits (commit), each model's commit or checksum
        "source": out.config.get("source"),
        # config.yaml's: torch, each model's device, dtype and GPU, and how its passes ran there (`passes`)
        "runtime": out.config.get("runtime"),
        "metrics": task.corpus_scores(records),
        "bleu_tokenizers": task.bleu_tokenizers(),  # each BLEU's sacrebleu tokenizer: 13a, flores101
        "metrics_skipped": task.skipped,  # a metric of the task not computed here, and why
        "throughput": {
            "seconds": seconds,
            "seconds_per_example": seconds / len(records),
            "generated_tokens_per_second": [
                t / seconds if seconds else 0.0 for t in _per_model(stats, "tokens_generated")
            ],
            "forward_passes": _per_model(stats, "forward_passes"),
            "rounds_per_example": rounds / len(records),
            "words_per_round": {str(k): words.count(k) / len(words) for k in sorted(set(words))} if words else {},
        },
        "environment": {
            "git_sha": git_sha(),
            "python": platform.python_version(),
            **{pkg: _version(pkg) for pkg in ("torch", "transformers", "tokenizers", "sacrebleu", "datasets")},
            "device": str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu",
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "ids": [r["id"] for r in records],  # the scored examples: tables pair runs on the same ids
    }


def _per_model(stats: list[dict], key: str) -> list[int]:
    return [sum(s[key][k] for s in stats) for k in range(len(stats[0][key]))]


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None
