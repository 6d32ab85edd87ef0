"""Fetch or convert the models a run will decode with, once, before its jobs start: each in its own process,
side by side.

- A hub model (the paper's pairs) is downloaded at its revision into the Hugging Face cache ($HF_HOME/hub):
  its configs, safetensors weights and tokenizer, nothing else (adafuse/loading/pretrained.py `HUB_FILES`). The
  cache records which commit the revision named (its refs/), and a job run with HF_HUB_OFFLINE=1 loads that
  commit from there without asking the hub. Files already in the cache are not fetched again.
- A GGUF model (the bundled pair) is dequantised once into the conversion cache ($ADAFUSE_CACHE).
- PairRM, where the run ranks with it (method=llm_blender method.ranker=pairrm, as protocol=paper does), is
  fetched like a hub model, with the config of the backbone it names.

It takes run.py's overrides and prepares what that run would use (`single` uses one member of the pair), and
prints one line per model: its name, then its commit and snapshot folder, or its converted folder.

    python scripts/prepare_models.py                              # the embedded default pair
    python scripts/prepare_models.py model_pair=llama_mistral     # any pair, as run.py composes it
    python scripts/prepare_models.py model_pair=llama_mistral protocol=paper method=llm_blender   # and PairRM
    python scripts/prepare_models.py method=single method.member=1
"""

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

from hydra.errors import HydraException

from adafuse.config import ModelConfig
from adafuse.errors import AdaFuseError, ModelFileError
from adafuse.loading.pretrained import fetch_from_hub, model_location, on_the_hub
from baselines.pairrm import fetch_pairrm
from conf.compose import compose_run
from eval.hub import describe
from eval.runner import decoding_models, settings_of


def prepared(cfg: ModelConfig) -> str:
    """Where the model now lies, as the line printed for it says it."""
    if not on_the_hub(cfg):
        return model_location(cfg)
    try:
        folder = fetch_from_hub(cfg)
    except Exception as err:
        if isinstance(err, AdaFuseError):
            raise
        # the hub's error, said with what to do about it
        url = f"https://huggingface.co/{cfg.path}"
        raise describe(
            err,
            f"model {cfg.name!r} ({cfg.path}, revision {cfg.revision or 'main'})",
            url,
            "the model's path and revision",
            "run this where there is, with HF_HOME on storage the compute nodes share",
            ModelFileError,
        ) from None
    return f"{cfg.path} at commit {folder.name} in {folder}"


def prepared_pairrm(path: str) -> str:
    return f"{path} in {fetch_pairrm(path)}"


def main(argv: list[str] | None = None) -> None:
    overrides = sys.argv[1:] if argv is None else argv
    try:  # a bad override or an unknown model fails here, before anything is fetched
        settings = settings_of(compose_run(*overrides))
        models: list[ModelConfig] = decoding_models(settings)
    except (AdaFuseError, HydraException) as err:
        sys.exit(f"prepare_models: {err}")
    pairrm = (
        getattr(settings.method, "pairrm_path", None) if getattr(settings.method, "ranker", "") == "pairrm" else None
    )
    with ProcessPoolExecutor(len(models) + 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = [(cfg.name, pool.submit(prepared, cfg)) for cfg in models]
        if pairrm is not None:
            jobs.append(("pairrm", pool.submit(prepared_pairrm, pairrm)))
        failed = []
        for name, job in jobs:
            try:
                print(f"{name}: {job.result()}", flush=True)
            except AdaFuseError as err:
                failed.append(f"{name}: {err}")
    if failed:
        sys.exit("prepare_models: " + "\nprepare_models: ".join(failed))


if __name__ == "__main__":
    main()
