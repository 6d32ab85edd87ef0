"""scripts/prepare_models.py: the models a run will need, converted into the cache ahead of time."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = str(ROOT / "scripts" / "prepare_models.py")


@pytest.mark.slow
def test_each_model_is_converted_into_the_cache_and_named_with_its_place(smol):
    # `smol` first: the session's model is then in the cache, so this measures no conversion twice.
    done = subprocess.run([sys.executable, SCRIPT, "smollm2_135m"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    name, where = done.stdout.strip().split(": ")
    assert name == "smollm2_135m" and (Path(where) / "config.json").is_file()
    assert Path(where).resolve() == Path(smol.model.name_or_path).resolve()


def test_an_unknown_model_is_refused_before_any_conversion():
    done = subprocess.run([sys.executable, SCRIPT, "smollm2_135m", "no_such_model"], capture_output=True, text=True)
    assert done.returncode != 0 and "no_such_model" in done.stderr and "smollm2_135m" in done.stderr
