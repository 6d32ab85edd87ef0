"""Where a model will load, resolved without loading it: what a run records and a resume must match."""

import pytest
import torch

from adafuse import Ensemble, ModelConfig
from adafuse.errors import ConfigError


def model(**settings) -> ModelConfig:
    return ModelConfig(name="smollm2_135m", bundle="smollm2_135m", **settings)


def test_auto_resolves_to_a_named_device_and_dtype():
    gpu = torch.cuda.is_available()
    place = Ensemble.placement([model(device="auto", dtype="auto")])[0]
    expected_device = f"cuda:{torch.cuda.current_device()}" if gpu else "cpu"
    assert place == {
        "device": expected_device,
        "dtype": "bfloat16" if gpu else "float32",
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
    }


def test_a_set_dtype_and_device_are_kept():
    assert Ensemble.placement([model(device="cpu", dtype="bfloat16"), model(device="cpu", dtype="float16")]) == [
        {"device": "cpu", "dtype": "bfloat16", "gpu": None},
        {"device": "cpu", "dtype": "float16", "gpu": None},
    ]


def test_a_cuda_device_gets_its_index_or_a_named_error_without_a_gpu():
    if torch.cuda.is_available():
        assert Ensemble.placement([model(device="cuda")])[0]["device"] == f"cuda:{torch.cuda.current_device()}"
    else:
        with pytest.raises(ConfigError, match="torch sees no CUDA device here"):
            Ensemble.placement([model(device="cuda")])


def test_a_device_torch_does_not_know_is_a_named_error():
    with pytest.raises(ConfigError, match="'gpu' is not a torch device"):
        Ensemble.placement([model(device="gpu")])
