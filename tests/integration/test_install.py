"""A non-editable install (`pip install .`) carries everything `Ensemble.from_config` and the method
registry need: the model configs by name and every method's entry point, with no checkout in sight, and the
server; and nothing of the repository-only packages (tools/, oracles/, tests/)."""

import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.support.paths import ROOT

PROBE = """
import sys
from pathlib import Path
import adafuse
from adafuse.ensemble import MODEL_CONFIGS, model_config
from adafuse.methods import METHODS
site = Path(sys.argv[1]).resolve()
assert Path(adafuse.__file__).resolve().is_relative_to(site), adafuse.__file__
assert model_config("smollm2_135m").bundle == "smollm2_135m"
assert model_config("llama31_8b_instruct").path == "meta-llama/Llama-3.1-8B-Instruct"
assert {"adafuse", "single", "unite", "deepen", "sweetspan", "llm_blender"} <= set(METHODS)
assert METHODS["sweetspan"].config.__module__ == "baselines.sweetspan"
assert (Path(MODEL_CONFIGS).parent / "config.yaml").is_file()
import serve.app  # the server ships too (its extra's packages come from the venv below)
assert Path(serve.app.__file__).resolve().is_relative_to(site), serve.app.__file__
print("ok")
"""


def test_a_plain_install_ships_the_configs_and_the_entry_points(tmp_path):
    source = tmp_path / "source"  # setuptools builds inside the source tree: keep the checkout clean
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file() and not name.startswith("results/"):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(fresh), "platbase": str(fresh)}))
    # The project alone goes into the fresh venv; its dependencies are read from this one.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    # The repository-only packages (maintainer tooling, the oracles, the tests, the user's commands) stay behind.
    assert not [name for name in ("tools", "oracles", "tests", "scripts") if (site / name).exists()]
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    done = subprocess.run(
        [str(fresh / "bin" / "python"), "-c", PROBE, str(site)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


PROBE_HUB = """
import datasets, huggingface_hub
try:
    datasets.load_dataset("google-research-datasets/nq_open", split="validation")
except Exception as err:
    print(datasets.__version__, huggingface_hub.__version__, type(err).__name__, err)
"""


@pytest.mark.slow
def test_the_oldest_datasets_the_project_admits_knows_the_hub_client_of_the_oldest_transformers(tmp_path, require):
    """transformers >= 5.23 needs huggingface-hub >= 1 (an httpx client); datasets before 4.2 predate it, declare
    no bound that says so, and let its errors through unread: an unreachable hub surfaces as the client's own
    ConnectError, where eval/hub.py and the user read datasets' 'Couldn't reach'. The oldest datasets and
    transformers the project's pins admit (uv's lowest-direct resolution, from the package index) are installed
    side by side and pointed at a hub that refuses connections."""
    pins = [
        str(requirement)
        for requirement in map(Requirement, requires("adafuse"))
        if requirement.name in ("datasets", "transformers") and requirement.marker is None
    ]
    assert len(pins) == 2, pins
    venv = tmp_path / "venv"
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    installed = subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "--resolution",
         "lowest-direct", *pins],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    require(
        installed.returncode == 0, f"the package index (uv pip install {' '.join(pins)}): {installed.stderr[-500:]}"
    )
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", PROBE_HUB], capture_output=True, text=True, env=env, timeout=300
    )
    version, hub, error = done.stdout.split()[:3]
    assert error == "ConnectionError", f"datasets {version} with huggingface-hub {hub}: {done.stdout[-500:]}"
