"""What the tests need to try tools/bad_inputs.py's cases: each case's prepared situation (its `setup`) and files in
a folder, a case by its key, and its message as a pattern."""

import fcntl
import json
import os
import re
import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.support.paths import ROOT
from tools.bad_inputs import CASES, CUSTOM, PROMPTS, BadInput

FAST = "run.py", "eval.report"  # the tools whose cases tests/config/test_bad_inputs.py runs itself


# ---- the prepared situations -----------------------------------------------------------------------------


def admitted_run(folder: Path) -> None:
    """{dir}/run as a process of task=custom with the default settings leaves it once admitted, its prompts in
    {dir}/prompts.jsonl: its config.yaml, written as eval/results.py writes it (by hand here, so that the case
    means the same for any version of it)."""
    import yaml
    from omegaconf import OmegaConf

    from conf.compose import compose_run
    from eval.runner import decoding_models, model_sources, runtime_of, settings_of
    from eval.tasks import Task

    (folder / "prompts.jsonl").write_text(PROMPTS)
    cfg = compose_run(*[a.format(dir=folder) for a in CUSTOM], "wandb.mode=disabled")
    settings = settings_of(cfg)
    models = decoding_models(settings)
    source = {"data": Task(settings.task, settings.data).sources.record(), "models": model_sources(models)}
    config = {**OmegaConf.to_container(cfg, resolve=True), "source": source, "runtime": runtime_of(models)}
    (folder / "run").mkdir()
    (folder / "run" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def run_with_the_defaults(folder: Path) -> None:
    """The run of `admitted_run` with its one prediction written."""
    admitted_run(folder)
    (folder / "run" / "predictions.jsonl").write_text(json.dumps({"id": "a", "prediction": " 4"}) + "\n")


def run_on_a_gpu(folder: Path) -> None:
    """The run of `run_with_the_defaults` as if decoded on a GPU: SmolLM2 in bfloat16 on an H200."""
    import yaml

    run_with_the_defaults(folder)
    path = folder / "run" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config["runtime"]["models"][0] |= {"device": "cuda:0", "dtype": "bfloat16", "gpu": "NVIDIA H200"}
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def run_from_other_prompts(folder: Path) -> None:
    """The run of `run_with_the_defaults`, its prompts file as it was then: another file than {dir}/prompts.jsonl
    now (the same ids, other prompts)."""
    import yaml

    run_with_the_defaults(folder)
    path = folder / "run" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    (name,) = config["source"]["data"]["files"]
    config["source"]["data"]["files"][name] = "0" * 64
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


@contextmanager
def shard_held_by_another_run(folder: Path):
    """The run of `admitted_run`, its shard 0 of 1 held by it (as a process holds it while its models load)."""
    admitted_run(folder)
    with open(folder / "run" / ".shard-0-of-1.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"pid {os.getpid()} on {os.uname().nodename}")
        lock.flush()
        yield


def truncated_gguf(folder: Path) -> None:
    """The first 2 MB of the bundled SmolLM2 GGUF: its header whole, its tensors cut."""
    from adafuse.loading.bundled import BUNDLES

    (bundled,) = BUNDLES["smollm2_135m"]()
    with open(bundled, "rb") as source:
        (folder / "truncated.gguf").write_bytes(source.read(2_000_000))


def truncated_safetensors(folder: Path) -> None:
    """SmolLM2's converted folder (config and tokenizer) with a model.safetensors cut short."""
    import torch
    from safetensors.torch import save_file

    from adafuse.ensemble import model_config
    from adafuse.loading.pretrained import converted_gguf_dir, default_cache_dir

    converted = converted_gguf_dir(model_config("smollm2_135m"), default_cache_dir())
    model = folder / "model"
    model.mkdir()
    for file in converted.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, model / file.name)
    save_file({"weight": torch.zeros(1000)}, model / "model.safetensors")
    whole = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(whole[: len(whole) // 2])


def committed_run(folder: Path) -> None:
    """A copy of a committed grid run in {dir}/run (Gemma-3 alone on 100 NQ questions)."""
    shutil.copytree(ROOT / "results/grid/nq/single/tiny/method.member=1", folder / "run")


def bad_input(key: str) -> BadInput:
    """The case named `key`."""
    (case,) = [c for c in CASES if c.key == key]
    return case


SETUPS = {
    f.__name__: f
    for f in (
        run_with_the_defaults,
        run_from_other_prompts,
        run_on_a_gpu,
        shard_held_by_another_run,
        truncated_gguf,
        truncated_safetensors,
        committed_run,
    )
}


@contextmanager
def prepared(case: BadInput, folder: Path):
    """`folder` holding the case's situation and files, for as long as the block runs."""
    with ExitStack() as stack:
        if case.setup is not None:
            made = SETUPS[case.setup](folder)
            if made is not None:
                stack.enter_context(made)
        for name, content in case.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        yield


def pattern(message: str, folder: Path) -> re.Pattern:
    """The message as a regular expression: {dir} is `folder`, any other {name} stands for some text."""
    parts = re.split(r"(\{\w+\})", message)
    return re.compile(
        "".join(
            re.escape(str(folder)) if p == "{dir}" else ".+?" if re.fullmatch(r"\{\w+\}", p) else re.escape(p)
            for p in parts
        )
    )
