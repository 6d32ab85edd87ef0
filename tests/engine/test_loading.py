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


def internlm3_shaped(folder, paper_pair):
    """A folder laid out as the hub's internlm/internlm3-8b-instruct: its config.json's keys (model_type internlm3,
    dynamic rope scaling, qkv_bias and bias, an auto_map to the repository's own code) at tiny sizes, a SentencePiece
    tokenizer.model with the repository's tokenizer_config.json (its own tokenizer class), tiny random weights, and
    the repository's code files, here code that fails if it is ever run."""
    import json
    import shutil

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, InternLM3Config

    folder.mkdir()
    for name in ("configuration_internlm3.py", "modeling_internlm3.py", "tokenization_internlm3.py"):
        (folder / name).write_text("raise RuntimeError('the repository\\'s own code ran')\n")
    shutil.copy(paper_pair / "mistral7b_instruct_v03" / "tokenizer.model", folder / "tokenizer.model")
    config = {
        "architectures": ["InternLM3ForCausalLM"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_internlm3.InternLM3Config",
            "AutoModel": "modeling_internlm3.InternLM3Model",
            "AutoModelForCausalLM": "modeling_internlm3.InternLM3ForCausalLM",
        },
        "bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "model_type": "internlm3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": 2,
        "qkv_bias": False,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 6.0, "rope_type": "dynamic"},
        "rope_theta": 50000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.47.1",
        "use_cache": False,
        "vocab_size": 32768,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 2})
    )
    tokenizer_config = {
        "tokenizer_class": "InternLM3Tokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_internlm3.InternLM3Tokenizer", None]},
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    torch.manual_seed(0)
    weights = AutoModelForCausalLM.from_config(InternLM3Config(**{k: v for k, v in config.items() if k != "auto_map"}))
    save_file({k: v.contiguous() for k, v in weights.state_dict().items()}, folder / "model.safetensors")
    return folder


def test_internlm3_loads_with_transformers_own_support_never_its_repositorys_code(tmp_path, require):
    """transformers >= 5.23 has InternLM3 built in (its Llama implementation); with trust_remote_code the repository's
    own, older code would run instead, unpinned. Its config leaves it off, so that code never runs."""
    from adafuse import Ensemble
    from tools.make_paper_pair import cached

    try:
        paper_pair = cached()
    except SystemExit as missing:  # the tokenizer files come from the test extra's packages
        require(False, str(missing))
    cfg = model_config("internlm3_8b_instruct")
    folder = internlm3_shaped(tmp_path / "internlm3", paper_pair)
    local = model_config({**vars(cfg), "path": str(folder), "dtype": "float32", "device": "cpu"})
    ensemble = Ensemble.from_config([local])
    gen = ensemble.decode("Hello world", method="single", max_new_tokens=3)
    assert gen.stats.tokens_generated == [3]
    assert type(ensemble.members[0].model).__name__ == "LlamaForCausalLM"  # transformers' InternLM3
