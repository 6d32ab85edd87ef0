"""A tiny, randomly initialised PairRM (DeBERTa-v2) in either published checkpoint layout, built from a
config (PairRM itself is a hub download): llm-blender/PairRM's (a ranker config that names its backbone)
and llm-blender/PairRM-hf's (a DeBERTa-v2 config with the prefix-token ids)."""

import json
import string

import torch
from safetensors.torch import save_file
from transformers import DebertaV2Config, DebertaV2Tokenizer

from baselines.pairrm import CANDIDATE, CANDIDATE1, CANDIDATE2, SOURCE, PairRMModel

WORDS = ["the", "capital", "of", "France", "is", "Paris", "Lyon", "Berlin", "answer", "What"]


def tiny_tokenizer() -> DebertaV2Tokenizer:
    specials = [("[PAD]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[UNK]", 0.0), ("[MASK]", 0.0)]
    pieces = [("▁", -2.0)] + [(c, -5.0) for c in string.ascii_letters + string.digits + string.punctuation]
    pieces += [("▁" + w, -3.0) for w in WORDS]
    tokenizer = DebertaV2Tokenizer(vocab=specials + pieces, unk_id=3)
    tokenizer.add_special_tokens({"additional_special_tokens": [SOURCE, CANDIDATE1, CANDIDATE2, CANDIDATE]})
    return tokenizer


def tiny_backbone(vocab_size: int) -> DebertaV2Config:
    return DebertaV2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=2048,
        relative_attention=True,
        position_buckets=32,
        pos_att_type=["p2c", "c2p"],
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        type_vocab_size=0,
        position_biased_input=False,
    )


def write_checkpoint(directory, layout: str, seed: int = 0):
    """A random PairRM in one of the two published layouts; returns its state dict."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    backbone = tiny_backbone(len(tokenizer))
    torch.manual_seed(seed)
    model = PairRMModel(backbone)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, directory / "model.safetensors")
    tokenizer.save_pretrained(directory)
    ids = tokenizer.convert_tokens_to_ids([SOURCE, CANDIDATE1, CANDIDATE2, CANDIDATE])
    if layout == "hf":
        config = backbone.to_dict() | dict(zip(["source_prefix_id", "cand1_prefix_id", "cand2_prefix_id"], ids[:3]))
        config["architectures"] = ["DebertaV2PairRM"]
        (directory / "config.json").write_text(json.dumps(config))
    else:
        backbone_dir = directory.parent / f"{directory.name}-backbone"
        backbone.save_pretrained(backbone_dir)
        ranker = {"ranker_type": "pairranker", "model_type": "deberta", "model_name": str(backbone_dir)}
        ranker |= {"source_maxlength": 1224, "candidate_maxlength": 412, "n_tasks": 1}
        (directory / "config.json").write_text(json.dumps(ranker))
    return state
