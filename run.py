"""Decode a benchmark with an LLM ensemble, score it, and write the results.

    python run.py                                          # the embedded default: tiny pair, AdaFuse, NQ slice
    python run.py model_pair=llama_mistral task=nq         # the paper's main setting (GPU + hub access)
    python run.py task=gsm8k method=single method.member=1 data.dir=../shared/data task.limit=50
    python run.py -m method.tau=0.3,0.5,0.7,0.9            # a sweep, one run after another in this process
    python run.py -m hydra/launcher=slurm task=nq,squad method.tau=0.5,0.7   # one SLURM job per combination
    python run.py -m hydra/launcher=slurm task.num_shards=4 task.shard=0,1,2,3   # one run in four jobs

Each run writes to results/<task>/<method>/<model_pair>/<run_id>/; rerunning a command resumes there.
A sweep's own records (multirun.yaml, submitit's job folders and logs) go to multirun/<date>/<time>/.
"""

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from adafuse.errors import AdaFuseError
from conf.schema import register
from eval.results import writable_dir
from eval.runner import main

log = logging.getLogger("run")

register()


def refuse(err: AdaFuseError) -> None:
    """A bad input: one line that names it, no traceback."""
    log.error("%s: %s", type(err).__name__, err)
    sys.exit(2)


class CheckRunDir(Callback):
    """Hydra creates the run directory before `cli` runs, and a traceback is all it says when it cannot:
    check first (conf/config.yaml registers this), so that an unwritable results_dir is a named error."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        try:
            writable_dir(Path(config.hydra.run.dir))
        except AdaFuseError as err:
            refuse(err)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        try:  # every job's run directory lies below it
            writable_dir(Path(config.results_dir))
        except AdaFuseError as err:
            refuse(err)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def cli(cfg: DictConfig) -> float | None:
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        metrics = main(cfg, Path(run_dir))
    except AdaFuseError as err:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # the launcher reports the failed job, with this error, when the sweep ends
        refuse(err)
    log.info("results in %s", run_dir)
    if metrics is None:  # other shards still decoding: the last one to finish writes metrics.json
        return None
    return next(iter(metrics["metrics"].values()), None)  # the primary metric, for sweepers that optimise


if __name__ == "__main__":
    # Jobs that submitit starts (on SLURM or locally) unpickle `cli` and import eval/, adafuse/ and
    # conf/ by name: point them at this checkout, whatever their working directory or installed copy.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")])
    )
    cli()
