"""scripts/prepare_models.py: the models a run will decode with, converted into the cache ahead of time."""

from pathlib import Path

import pytest

from tests.support.run_in_process import run_script


@pytest.mark.slow
def test_the_runs_models_are_converted_into_the_cache_and_named_with_their_place(smol):
    # `smol` first: the session's model is then in the cache, so this measures no conversion twice.
    # method=single: the run decodes with the pair's first member only, so only it is prepared. In this
    # process (tests/support/run_in_process.py): no interpreter start-up to wait for.
    done = run_script("prepare_models", "method=single")
    assert done.returncode == 0, done.stderr[-2000:]
    name, where = done.stdout.strip().split(": ")
    assert name == "smollm2_135m" and (Path(where) / "config.json").is_file()
    assert Path(where).resolve() == Path(smol.model.name_or_path).resolve()


@pytest.mark.parametrize("override, named", [("model_pair=no_such_pair", "no_such_pair"), ("tau=2", "tau")])
def test_a_bad_override_is_refused_before_any_conversion(override, named):
    done = run_script("prepare_models", override)
    assert done.returncode != 0 and done.stderr.startswith("prepare_models:") and named in done.stderr
