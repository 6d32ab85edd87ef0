"""A non-editable install (`pip install .`) carries everything `Ensemble.from_config` and the method
registry need: the model configs by name and every method's entry point, with no checkout in sight, and the
server; and nothing of the repository-only packages (tools/, oracles/, tests/)."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tools.paths import ROOT

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
