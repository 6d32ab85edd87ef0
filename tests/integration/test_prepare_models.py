"""scripts/prepare_models.py: the models a run will decode with, converted into the cache or fetched from the hub
ahead of time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adafuse import model_config
from tests.support.fake_hub import serving
from tests.support.paper_hub import PAIRRM, UNREAD, hub_repos
from tests.support.paper_pair import NAMES
from tests.support.paths import ROOT, SHARED_DATA
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


def prepare(env: dict, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "scripts" / "prepare_models.py"), *overrides]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_paper_pair_is_fetched_once_from_the_hub_and_its_runs_read_it_offline(paper_pair_dir, tmp_path):
    """The hub on the loopback (tests/support/fake_hub.py) serves the pair in shape and PairRM under their real
    ids: prepare_models downloads what loading reads into $HF_HOME, once; with the hub gone and HF_HUB_OFFLINE=1,
    the paper's LLM-Blender run (PairRM ranks) loads the commits the cache recorded, and records them."""
    repos = hub_repos(tmp_path / "hub", paper_pair_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {"HF_HOME": str(tmp_path / "hf")}
    run = ["model_pair=llama_mistral", "protocol=paper", "method=llm_blender"]
    with serving(repos) as hub:
        done = prepare(env | {"HF_ENDPOINT": hub.url}, *run)
        assert done.returncode == 0, done.stderr[-3000:]
        fetched = dict(hub.downloads)
        again = prepare(env | {"HF_ENDPOINT": hub.url}, *run)
        assert again.returncode == 0 and again.stdout == done.stdout, again.stderr[-3000:]
        assert dict(hub.downloads) == fetched, "a second prepare fetched files again"
        commits = {repo: hub.commit(repo) for repo in repos}
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    for name, repo in [(n, model_config(n).path) for n in NAMES]:
        assert lines[name].startswith(f"{repo} at commit {commits[repo]} in ")
        snapshot = Path(lines[name].split(" in ", 1)[1])
        files = {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()}
        served = {p.relative_to(repos[repo]).as_posix() for p in repos[repo].rglob("*") if p.is_file()}
        unread = {*UNREAD[name], "adafuse_shape.json", "README.md"}
        assert files == served - unread, "configs, weights and tokenizer files only"
    assert lines["pairrm"].startswith(f"{PAIRRM} in ")

    offline = env | {"HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(ROOT / "run.py"), *run, "task=nq", "task.limit=1", "task.max_new_tokens=4"]
    command += [f"data.dir={SHARED_DATA}", f"results_dir={tmp_path / 'results'}", "wandb.mode=disabled"]
    decoded = subprocess.run(command, env=offline, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    (metrics,) = (tmp_path / "results").rglob("metrics.json")
    models = json.loads(metrics.read_text())["source"]["models"]
    assert [(m["hub"], m["commit"]) for m in models] == [
        (model_config(n).path, commits[model_config(n).path]) for n in NAMES
    ]
