"""Convert models into the cache before they are needed, each in its own process, side by side.

A GGUF model (the bundled pair) is dequantised on first use and cached (adafuse/loading.py). Jobs that
start on a fresh cache wait for that conversion, one model after the other; this does it once, ahead:
before a SLURM sweep, in CI before the tests, or after an install.

    python scripts/prepare_models.py                      # the embedded default pair
    python scripts/prepare_models.py smollm2_135m qwen3_8b  # any names from conf/model/
"""

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adafuse.ensemble import model_config  # noqa: E402
from adafuse.errors import AdaFuseError  # noqa: E402
from adafuse.loading import model_location  # noqa: E402

DEFAULT_PAIR = ["smollm2_135m", "gemma3_270m"]


def prepare(name: str) -> str:
    return model_location(model_config(name))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=DEFAULT_PAIR, help="names of files in conf/model/")
    names = parser.parse_args(argv).models
    try:
        for name in names:  # an unknown name fails here, before any work
            model_config(name)
    except AdaFuseError as err:
        sys.exit(f"prepare_models: {err}")
    with ProcessPoolExecutor(len(names), mp_context=multiprocessing.get_context("spawn")) as pool:
        for name, where in zip(names, pool.map(prepare, names)):
            print(f"{name}: {where}")


if __name__ == "__main__":
    main()
