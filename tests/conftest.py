"""Shared fixtures. The real bundled models load once per session (every run in the tests reuses
them); data comes from ../shared/data."""

import os
from pathlib import Path

import pytest

from tests.support.paths import SHARED_DATA

# One worker per core, at most 4 (each holds the bundled pair, ~3 GB), and the cores shared among them: a
# worker's torch, and the run.py processes it starts, take their share (OMP_NUM_THREADS), not every core each.
# Not one more than cores: a worker that waits on a SLURM job or a run.py process leaves its core to that
# process, not idle, and measured on 2 cores, three processes decoding side by side did 13% less work per
# second than two.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config) -> int:
    return min(os.cpu_count() or 1, MAX_WORKERS)


WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = int(os.environ.get("ADAFUSE_TEST_THREADS", max(1, (os.cpu_count() or 1) // WORKERS)))
os.environ["OMP_NUM_THREADS"] = str(THREADS)


def pytest_configure(config):
    """torch's threads, and the slow reference's cache-free log-probabilities remembered for the whole
    session: many tests run it over the same prompts (a pure function of model and ids; see
    oracles/reference.py). Bounded: 512 MiB by default. Not in xdist's controller, which runs no test:
    it starts the workers without first spending seconds importing torch."""
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no":
        return  # xdist's controller
    import torch

    from oracles import reference

    torch.set_num_threads(THREADS)
    reference.MEMO = reference.LogprobMemo(int(os.environ.get("ADAFUSE_TEST_MEMO_MIB", "512")) * 2**20)


@pytest.fixture(scope="session")
def require():
    """`require(available, what)`: the one rule for a test that needs something installed (a package of the
    `test` extra, a SLURM cluster). Where `what` is missing the test skips, saying so; in CI (CI=true, as
    .ci/run sets it), which installs the extra and starts the cluster, it fails: a check there cannot
    quietly shrink to a skip."""

    def check(available: bool, what: str) -> None:
        if not available:
            in_ci = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
            (pytest.fail if in_ci else pytest.skip)(f"{what} (CI={os.environ.get('CI', '')!r})")

    return check


@pytest.fixture(scope="session")
def cluster(require):
    """A SLURM cluster that answers (`bash slurm/cluster.sh start`; .ci/run starts one), for the `slurm` tests."""
    import shutil
    import subprocess

    client = shutil.which("sinfo") is not None
    require(client, "no SLURM client here: bash slurm/cluster.sh start (as root) installs and starts one")
    state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    up = state.returncode == 0 and bool({"idle", "mix", "alloc"} & set(state.stdout.split()))
    require(up, f"no SLURM node up ({state.stdout.strip() or state.stderr.strip()}): bash slurm/cluster.sh start")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"benchmark data not found at {SHARED_DATA} (set ADAFUSE_DATA_DIR)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny():
    """The embedded default pair: SmolLM2-135M-Instruct (byte-level BPE) + Gemma-3-270M (SentencePiece).

    Loaded through the runner's cache, so the runs that tests start with eval.runner.main() reuse it."""
    from adafuse.ensemble import model_config
    from eval.runner import load_ensemble

    pair = [model_config("smollm2_135m"), model_config("gemma3_270m")]
    return load_ensemble(pair, [0, 1], None)


@pytest.fixture(scope="session")
def smol(tiny):
    return tiny.members[0]


@pytest.fixture(scope="session")
def gemma(tiny):
    return tiny.members[1]


@pytest.fixture(scope="session")
def narrow(tiny):
    """The embedded pair with Gemma-3's sliding window narrowed to WINDOW tokens (real weights, shared with
    `tiny`): prompts of a few dozen tokens cross the window (tests/support/members.py `narrow_window`)."""
    from tests.support.members import WINDOW, narrow_window

    return [tiny.members[0].clone(), narrow_window(tiny.members[1], WINDOW)]


GEMMA_LAYERS = ["sliding_attention", "sliding_attention", "full_attention"]


@pytest.fixture(scope="session")
def tiny_shaped(tiny):
    """The embedded pair in shape: SmolLM2's and Gemma-3's real tokenizers, tiny random weights
    (tests/support/members.py `in_shape`); Gemma's sliding window WINDOW tokens, on sliding layers before
    a full one as in the real model (five, then one). A pass costs milliseconds, not a second."""
    from tests.support.members import WINDOW, in_shape

    smol, gemma = tiny.members
    return [
        in_shape(smol, seed=135, layers=2, kv_heads=2),
        in_shape(
            gemma,
            seed=270,
            layers=3,
            kv_heads=1,
            sliding_window=WINDOW,
            query_pre_attn_scalar=16,
            layer_types=GEMMA_LAYERS,
        ),
    ]


@pytest.fixture(scope="session")
def paper_pair_dir() -> Path:
    """The paper's pair in shape (real tokenizers, tiny random weights), built once and cached:
    tests/support/paper_pair.py. It needs llama-models and mistral-common (the `test` extra): without them the
    tests that use it fail, saying so, rather than pass by skipping."""
    from tests.support.paper_pair import paper_pair_dir as build

    try:
        return build()
    except SystemExit as err:
        pytest.fail(f"the paper-shaped pair cannot be built: {err}")


@pytest.fixture(scope="session")
def paper_pair(paper_pair_dir):
    """Llama-3.1-8B-Instruct and Mistral-7B-Instruct-v0.3 in shape, as members, float32 on the CPU.

    Loaded apart from the runner's member cache, so that the runs other tests start keep the tiny pair."""
    from adafuse import Ensemble
    from adafuse.config import ModelConfig
    from tests.support.paper_pair import NAMES

    return Ensemble.from_config([ModelConfig(name=n, path=str(paper_pair_dir / n), dtype="float32") for n in NAMES])
