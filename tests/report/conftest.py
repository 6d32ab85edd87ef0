"""Runs with traces, decoded by the bundled pair for the report's tests: AdaFuse and the member it is
compared with (Gemma-3), and the baselines whose trace the page draws (DeePEn aside), on the first NQ examples."""

from pathlib import Path

import pytest

from conf.compose import compose_run
from eval.runner import main
from tests.support.paths import SHARED_DATA

# Enough for several rounds and a stop string cut inside a winner (NQ's first examples), few enough for CI.
EXAMPLES = {"adafuse": 4, "single": 4, "unite": 2, "sweetspan": 2, "llm_blender": 2}
# Not DeePEn: building its vocabulary transfer for the pair takes ~15 minutes in a fresh cache (CI's).


def traced_run(root: Path, method: str, *extra: str) -> Path:
    overrides = [
        "task=nq",
        f"method={method}",
        f"task.limit={EXAMPLES[method]}",
        f"data.dir={SHARED_DATA}",
        "trace=true",
        "wandb.mode=disabled",
        "progress=false",
        *extra,
    ]
    out = root / method
    assert main(compose_run(*overrides), out) is not None
    return out


@pytest.fixture(scope="session")
def traced(tmp_path_factory, tiny) -> dict[str, Path]:
    """Run directories by method; `single` is Gemma-3-270M (member 1) alone."""
    root = tmp_path_factory.mktemp("traced")
    runs = {m: traced_run(root, m) for m in EXAMPLES if m != "single"}
    runs["single"] = traced_run(root, "single", "method.member=1")
    return runs
