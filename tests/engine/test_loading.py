"""Model entries resolve to files with clear errors; bundled GGUFs convert once and are reused."""

import subprocess
import sys
import time

import psutil
import pytest
from filelock import FileLock

from adafuse.config import ModelConfig, default_cache_dir
from adafuse.ensemble import model_config
from adafuse.errors import ConfigError, ModelFileError, UnknownNameError
from adafuse.loading.pretrained import converted_gguf_dir, gguf_parts, model_location


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


@pytest.mark.slow
def test_a_conversion_under_way_elsewhere_is_awaited_not_repeated(tmp_path):
    """A process that finds another converting the same GGUF (it holds the lock) waits, then takes that
    process's copy: workers and array jobs on a fresh cache convert a model once between them."""
    cfg = model_config("smollm2_135m")
    target = tmp_path / "gguf" / cfg.sha256
    target.parent.mkdir(parents=True)
    waiter = [sys.executable, "-c", WAIT_FOR_CONVERSION, str(tmp_path)]
    lock = target.parent / f"{cfg.sha256}.lock"
    with FileLock(lock):
        proc = subprocess.Popen(waiter, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Once it has read the GGUF through (its hash), it either waits on the lock or converts beside us,
        # which would show as a work directory of its own.
        gguf, reading, deadline = str(gguf_parts(cfg)[0]), False, time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            open_now = [f.path for f in psutil.Process(proc.pid).open_files()]
            if reading and gguf not in open_now:
                break
            reading |= gguf in open_now
            time.sleep(0.02)
        time.sleep(3)
        converting = list(target.parent.glob(".*"))
        assert proc.poll() is None and not converting, (converting, proc.poll())
        target.mkdir()  # what the lock holder leaves: a finished entry
        (target / "config.json").write_text("{}")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == str(target) and "converting" not in err


WAIT_FOR_CONVERSION = """
import logging, sys
from pathlib import Path
from adafuse.ensemble import model_config
from adafuse.loading.pretrained import converted_gguf_dir
logging.basicConfig(level=logging.INFO)
print(converted_gguf_dir(model_config("smollm2_135m"), Path(sys.argv[1])))
"""
