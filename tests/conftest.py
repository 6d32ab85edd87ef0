"""Shared fixtures. The real bundled models load once per session; data comes from ../shared/data."""

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("ADAFUSE_SHARED_DATA", ROOT.parent / "shared" / "data"))

torch.set_num_threads(int(os.environ.get("ADAFUSE_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"benchmark data not found at {SHARED_DATA} (set ADAFUSE_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny():
    """The embedded default pair: SmolLM2-135M-Instruct (byte-level BPE) + Gemma-3-270M (SentencePiece)."""
    from adafuse import Ensemble

    return Ensemble.from_config(["smollm2_135m", "gemma3_270m"])


@pytest.fixture(scope="session")
def smol(tiny):
    return tiny.members[0]


@pytest.fixture(scope="session")
def gemma(tiny):
    return tiny.members[1]
