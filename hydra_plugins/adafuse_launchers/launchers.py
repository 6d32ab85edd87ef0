"""Hydra's submitit launchers (conf/hydra/launcher/{slurm,local}.yaml), saying where each job writes.

A sweep submits its jobs and waits for them; before it waits, it logs each job's overrides and run
directory, so results can be watched (and `scripts/merge.py` run) while the jobs are queued.
Requeueing is submitit's: the launcher is checkpointable and a requeued job runs `main()` again,
which resumes from the run's predictions file.
"""

import logging
from collections.abc import Sequence

from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


def run_dirs(launcher, job_overrides: Sequence[Sequence[str]]) -> list[str]:
    """Each job's run directory, composed the way the job itself will compose it."""
    dirs = []
    for overrides in job_overrides:
        job = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
        dirs.append(str(OmegaConf.select(job, "hydra.sweep.subdir")))
    return dirs


class _Announcing:
    def launch(self, job_overrides, initial_job_idx):
        for idx, (overrides, path) in enumerate(zip(job_overrides, run_dirs(self, job_overrides)), initial_job_idx):
            log.info("job #%d (%s) writes to %s", idx, " ".join(overrides), path)
        log.info("submitit's job folders and logs: %s", self.params["submitit_folder"].replace("%j", "<job id>"))
        return super().launch(job_overrides, initial_job_idx)


class SlurmLauncher(_Announcing, submitit_launcher.SlurmLauncher):
    pass


class LocalLauncher(_Announcing, submitit_launcher.LocalLauncher):
    pass
