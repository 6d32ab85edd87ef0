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
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from adafuse.errors import AdaFuseError
from conf.schema import check_pair_name, register
from eval.results import writable_dir
from eval.runner import main

log = logging.getLogger("run")

register()


def refuse(err: AdaFuseError) -> None:
    """A bad input: one line that names it, no traceback, exit status 2; nothing of it in the run's log."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
    log.error("%s: %s", type(err).__name__, err)
    sys.exit(2)


class Refusals(Callback):
    """Bad input as one line (conf/config.yaml registers this), and a refused run leaves no trace on disk.

    Hydra creates the run directory before `cli` runs, and a traceback is all it says when it cannot: the
    directory is checked first, so an unwritable results_dir is a named error. A run refused later (bad
    settings, data, a busy or mismatched run directory: any AdaFuseError) removes the folders this process
    created, if they are still empty; Hydra writes neither its records nor its log there before the run is
    admitted (conf/config.yaml, `write_hydra_records`)."""

    def __init__(self):
        self.created: list[Path] = []  # the run directory and the parents this process created, deepest first

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        run_dir = Path(config.hydra.run.dir).absolute()
        self.created = [d for d in [run_dir, *run_dir.parents] if not d.exists()]
        try:
            writable_dir(run_dir)
        except AdaFuseError as err:
            refuse(err)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        try:  # every job's run directory lies below it
            writable_dir(Path(config.results_dir))
        except AdaFuseError as err:
            refuse(err)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        error = job_return._return_value  # `return_value` would raise it, after a line of Hydra's
        if job_return.status != JobStatus.FAILED or not isinstance(error, AdaFuseError):
            return
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            return  # the launcher reports the failed job, with this error, when the sweep ends
        for folder in self.created:
            try:
                folder.rmdir()  # only an empty one: whatever another process wrote there stays
            except OSError:
                break
        refuse(error)


def write_hydra_records(cfg: DictConfig, run_dir: Path) -> None:
    """Hydra's own records of the run in .hydra/ (the composed config, Hydra's, the overrides), written once the
    run is admitted: Hydra writes them before `cli` runs (hydra.output_subdir, off in conf/config.yaml), over
    those of a run that may hold the directory."""
    hydra_cfg = HydraConfig.get()
    records = run_dir / ".hydra"
    records.mkdir(exist_ok=True)
    OmegaConf.save(cfg, records / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), records / "hydra.yaml")
    OmegaConf.save(hydra_cfg.overrides.task, records / "overrides.yaml")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def cli(cfg: DictConfig) -> float | None:
    check_pair_name(cfg.model_pair.name, HydraConfig.get().runtime.choices.get("model_pair"))
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    metrics = main(cfg, run_dir, admitted=lambda: write_hydra_records(cfg, run_dir))
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
