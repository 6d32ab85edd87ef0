"""Decode a benchmark with an LLM ensemble, score it, and write the results.

    python run.py                                          # the embedded default: tiny pair, AdaFuse, NQ slice
    python run.py model_pair=llama_mistral task=nq         # the paper's main setting (GPU + hub access)
    python run.py task=gsm8k method=single method.member=1 data.dir=../shared/data task.limit=50
    python run.py -m method.tau=0.3,0.5,0.7,0.9 hydra/launcher=slurm   # a sweep on SLURM

Outputs go to results/<task>/<method>/<model_pair>/<run_id>/; rerunning a command resumes there.
"""

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from adafuse.errors import AdaFuseError
from conf.schema import register
from eval.runner import main

log = logging.getLogger("run")


def run_id(override_dirname: str) -> str:
    """The run directory's last part: the overrides that can change predictions, or 'default'."""
    return override_dirname.replace("/", "%") if override_dirname else "default"


register()
OmegaConf.register_new_resolver("run_id", run_id, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def cli(cfg: DictConfig) -> float | None:
    try:
        metrics = main(cfg, Path(HydraConfig.get().runtime.output_dir))
    except AdaFuseError as err:  # a bad input: one line that names it, no traceback
        log.error("%s: %s", type(err).__name__, err)
        sys.exit(2)
    log.info("results in %s", HydraConfig.get().runtime.output_dir)
    return next(iter(metrics["metrics"].values()), None)  # the primary metric, for sweepers that optimise


if __name__ == "__main__":
    cli()
