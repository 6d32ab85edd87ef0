"""Convert the models a run will decode with into the cache before it starts, each in its own process,
side by side.

A GGUF model (the bundled pair) is dequantised on first use and cached (adafuse/loading/pretrained.py). Jobs that
start on a fresh cache wait for that conversion, one model after the other; this does it once, ahead:
before a SLURM sweep, in CI before the tests, or after an install. It takes run.py's overrides and
prepares the models that run would use (`single` uses one member of the pair).

    python scripts/prepare_models.py                              # the embedded default pair
    python scripts/prepare_models.py model_pair=llama_mistral     # any pair, as run.py composes it
    python scripts/prepare_models.py method=single method.member=1
"""

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

from hydra.errors import HydraException

from adafuse.config import ModelConfig
from adafuse.errors import AdaFuseError
from adafuse.loading.pretrained import model_location
from conf.compose import compose_run
from eval.runner import decoding_models, settings_of


def main(argv: list[str] | None = None) -> None:
    overrides = sys.argv[1:] if argv is None else argv
    try:  # a bad override or an unknown model fails here, before any conversion
        models: list[ModelConfig] = decoding_models(settings_of(compose_run(*overrides)))
    except (AdaFuseError, HydraException) as err:
        sys.exit(f"prepare_models: {err}")
    with ProcessPoolExecutor(len(models), mp_context=multiprocessing.get_context("spawn")) as pool:
        for cfg, where in zip(models, pool.map(model_location, models)):
            print(f"{cfg.name}: {where}")


if __name__ == "__main__":
    main()
