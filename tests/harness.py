"""Compose the Hydra config exactly as `python run.py ...` would, without a subprocess."""

from hydra import compose, initialize_config_dir

import run  # noqa: F401  (registers the schemas and the run_id resolver, as the command line does)
from tests.conftest import ROOT


def compose_run(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))
