"""The backend (adafuse/backend/__init__.py): it checks the installed transformers and a model for every feature the
engine relies on, naming what is missing, and installs itself on a model once."""

import importlib

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, masking_utils, modeling_gguf_pytorch_utils

from adafuse.backend import Backend, backend_for, check_model, check_transformers
from adafuse.backend.invariance import PREFIX
from adafuse.errors import BackendError


def installed_transformers():
    """The transformers module as `import transformers` finds it now (its lazy module replaces itself in
    sys.modules once a submodule is imported)."""
    return importlib.import_module("transformers")


def test_the_installed_transformers_has_every_feature():
    assert check_transformers().version == installed_transformers().__version__


def test_an_old_transformers_is_refused_naming_the_version(monkeypatch):
    monkeypatch.setattr(installed_transformers(), "__version__", "5.10.0")
    with pytest.raises(BackendError, match=r"transformers >= 5\.23 \(installed: 5\.10\.0\)"):
        check_transformers()


def test_a_missing_feature_is_named(monkeypatch):
    monkeypatch.delattr(masking_utils, "create_sliding_window_causal_mask")
    with pytest.raises(BackendError, match="masking_utils.create_sliding_window_causal_mask"):
        check_transformers()


def test_a_gguf_reader_the_shared_reader_cannot_reach_is_named(monkeypatch):
    monkeypatch.setattr(modeling_gguf_pytorch_utils, "GGUFReader", object, raising=False)
    with pytest.raises(BackendError, match="GGUF reader imported"):
        check_transformers()


def tiny_llama():
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


def test_a_model_without_what_the_engine_uses_is_refused_naming_it():
    model = tiny_llama()
    model.lm_head = torch.nn.Identity()
    with pytest.raises(BackendError, match="output embeddings are not a torch.nn.Linear"):
        check_model(model)


def test_install_wraps_a_model_once_and_the_backend_is_one_per_device_type():
    backend = backend_for(torch.device("cpu"))
    assert backend_for(torch.device("cpu")) is backend and backend.cores is not None
    model = tiny_llama()
    installed = backend.install(model)
    forward = model.lm_head.forward
    assert backend.install(model) is installed and model.lm_head.forward is forward  # not wrapped twice
    assert installed.splits_attention and model.config._attn_implementation.startswith(PREFIX)
    assert not installed.blocked_head  # a head narrower than the blocks pay for keeps one multiply


def test_off_the_cpu_the_cpu_only_devices_are_off():
    backend = Backend("cuda")
    assert backend.cores is None and not backend.side_by_side and backend.probes.cores is None
