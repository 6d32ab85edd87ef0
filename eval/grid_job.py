"""One job of a packed grid (`scripts/run_grid.py --pack`): a multirun of the plan run by run.py inside this job.

The grid submits its multiruns as the jobs of one Hydra multirun of this app (conf/grid_job.yaml), through the
launcher of its command line, so each SLURM job holds a whole sweep: run.py's basic launcher runs its runs one
after another in one process, which loads the pair once (a model it drops is freed). That pays where loading a
pair costs more than decoding a run's examples (small slices, a check of the whole grid). A job requeued after
preemption or its time limit runs its multirun again, and every run resumes from its predictions.
"""

import json
import subprocess
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parent.parent


@hydra.main(version_base="1.3", config_path="../conf", config_name="grid_job")
def job(cfg: DictConfig) -> None:
    overrides = json.loads(Path(cfg.plan).read_text())[cfg.index]
    sweep_dir = Path(cfg.plan).parent / str(cfg.index)
    command = [sys.executable, str(ROOT / "run.py"), "-m", f"hydra.sweep.dir={sweep_dir}", *overrides]
    done = subprocess.run(command)
    if done.returncode:
        raise RuntimeError(f"run.py -m {' '.join(overrides)} exited {done.returncode}; its log is above")


if __name__ == "__main__":
    job()
