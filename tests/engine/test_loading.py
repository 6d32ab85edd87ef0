"""Model entries resolve to files with clear errors; bundled GGUFs convert once and are reused."""

import time

import pytest

from adafuse.config import ModelConfig
from adafuse.ensemble import model_config
from adafuse.errors import ConfigError, ModelFileError, UnknownNameError
from adafuse.loading import converted_gguf_dir, default_cache_dir, model_location


def test_missing_gguf_file_names_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelFileError, match=str(missing)):
        model_location(ModelConfig(name="m", path=str(missing)), tmp_path)


def test_corrupt_gguf_names_the_path_and_both_hashes(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ModelFileError, match=f"{bad} is corrupt.*expected 0000"):
        model_location(ModelConfig(name="m", path=str(bad), sha256="0000"), tmp_path)


def test_local_paths_must_exist_and_hold_a_model(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        model_location(ModelConfig(name="m", path=str(tmp_path / "absent")), tmp_path)
    with pytest.raises(ModelFileError, match="no config.json"):
        model_location(ModelConfig(name="m", path=str(tmp_path)), tmp_path)
    assert model_location(ModelConfig(name="m", path="meta-llama/Llama-3.1-8B-Instruct"), tmp_path) == (
        "meta-llama/Llama-3.1-8B-Instruct"
    )


def test_unknown_names_list_the_choices():
    with pytest.raises(UnknownNameError, match="smollm2_135m"):
        model_config("smollm2")
    with pytest.raises(UnknownNameError, match="gemma3_270m"):
        model_location(ModelConfig(name="m", bundle="gemma_3"))


def test_an_unknown_setting_in_a_model_entry_is_refused_by_name():
    with pytest.raises(ConfigError, match="unknown setting.*dtpye"):
        model_config({"name": "m", "path": "some/model", "dtpye": "float16"})
    assert model_config("smollm2_135m").bundle == "smollm2_135m"  # Hydra's defaults list is not a setting


@pytest.mark.slow
def test_bundled_models_convert_once_and_reload_from_the_cache(tiny):
    for name in ("smollm2_135m", "gemma3_270m"):
        cfg = model_config(name)
        first = converted_gguf_dir(cfg, default_cache_dir())
        stamp = (first / "config.json").stat().st_mtime
        started = time.perf_counter()
        again = converted_gguf_dir(cfg, default_cache_dir())
        assert again == first and (again / "config.json").stat().st_mtime == stamp
        assert time.perf_counter() - started < 10  # a hash check, not a 40-85 s conversion
        assert again.name == cfg.sha256
        assert not [p for p in again.parent.iterdir() if p.name.startswith(".")]  # no half-built entries left


@pytest.mark.slow
def test_pinned_hash_mismatch_on_a_bundled_model_is_refused(tmp_path):
    cfg = model_config("smollm2_135m")
    cfg.sha256 = "f" * 64
    with pytest.raises(ModelFileError, match="SmolLM2-135M-Instruct.Q4_1.gguf is corrupt"):
        model_location(cfg, tmp_path)
