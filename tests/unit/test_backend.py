"""The backend seam (adafuse/backend/): it checks the installed transformers and a model for every feature the
engine relies on, naming what is missing, prepares a model once, and is one per device type."""

import importlib

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, masking_utils, modeling_gguf_pytorch_utils

from adafuse.backend import BACKENDS, backend_for, check_model, check_transformers
from adafuse.backend.attention import PREFIX
from adafuse.backend.cpu.exact import ExactBackend
from adafuse.backend.cpu.projection import BlockedHead
from adafuse.backend.cpu.tiles import TiledHead, TiledLinear
from adafuse.backend.install import restore
from adafuse.backend.probe_store import ProbeStore
from adafuse.errors import BackendError


def installed_transformers():
    """The transformers module as `import transformers` finds it now (its lazy module replaces itself in
    sys.modules once a submodule is imported)."""
    return importlib.import_module("transformers")


def test_the_installed_transformers_has_every_feature():
    assert check_transformers() == installed_transformers().__version__


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


def test_prepare_changes_a_model_once_and_the_backend_is_one_per_device_type():
    backend = backend_for(torch.device("cpu"))
    assert backend_for(torch.device("cpu")) is backend and backend.cores is not None
    model = tiny_llama()
    prepared = backend.prepare(model)
    assert backend.prepare(model) is prepared and type(model.lm_head) is TiledHead  # not changed twice
    assert prepared.splits_attention and model.config._attn_implementation.startswith(PREFIX)
    assert all(
        type(m) is TiledLinear for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.lm_head
    )
    assert not isinstance(model.lm_head, BlockedHead)  # a head narrower than the blocks pay for keeps one multiply


def test_off_the_cpu_the_cpu_only_parts_are_off():
    backend = ExactBackend("cuda")
    assert backend.probes.cores is None and backend.name == "cuda-exact"


def test_device_auto_puts_member_k_on_the_k_th_gpu_and_a_named_device_stays(monkeypatch):
    """`device: auto` on a node of 4 GPUs: member k on cuda:k (cycling past the fourth); a named device wins; with
    no GPU, the CPU (adafuse/loading/pretrained.py `member_device`)."""
    from adafuse import Ensemble
    from adafuse.config import ModelConfig

    models = [ModelConfig(name=f"m{k}", path="/nowhere") for k in range(5)]
    models[3] = ModelConfig(name="m3", path="/nowhere", device="cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert [m.device for m in Ensemble.placed(models)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:0"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert {m.device for m in Ensemble.placed(models[:3])} == {"cpu"}


def test_backends_are_found_by_device_type_through_their_entry_points_and_any_other_type_gets_the_exact_one():
    assert {"cpu", "cuda", "exact"} <= set(BACKENDS)
    assert type(backend_for("cpu")).__name__ == "CpuBackend"
    other = backend_for("meta")  # a device type without a backend of its own
    assert type(other) is ExactBackend and other.name == "meta-exact"


def test_what_a_backend_changed_in_a_model_is_taken_back_and_the_model_computes_as_loaded():
    """adafuse/backend/install.py: the one place that swaps a layer's class and routes attention, and takes both
    back."""
    model, fresh = tiny_llama(), tiny_llama()
    fresh.load_state_dict(model.state_dict())
    classes = {name: type(module) for name, module in model.named_modules()}
    ExactBackend("cpu", ProbeStore(None)).prepare(model)
    assert any(type(module) is not classes[name] for name, module in model.named_modules())
    assert model.config._attn_implementation.startswith(PREFIX)
    restore(model)
    assert {name: type(module) for name, module in model.named_modules()} == classes
    assert model.config._attn_implementation == "sdpa"
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, fresh(ids).logits)
