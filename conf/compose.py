"""The run config composed exactly as `python run.py ...` composes it, without a command line: for
tests and scripts (Hydra's compose API)."""

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from conf.schema import register

CONF_DIR = Path(__file__).resolve().parent


def compose_run(*overrides: str, hydra: bool = False) -> DictConfig:
    """The composed config for these command-line overrides; `hydra=True` keeps the `hydra` node."""
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)
