"""What the backends rely on in transformers, checked before any model is prepared, so that a transformers
release that moves one fails at start with an error that names it (`BackendError`), not in the middle of a run:
the attention and mask registries (adafuse/backend/attention.py), the mask functions and their parameters,
the cache layer API (adafuse/member/cache.py builds on `DynamicLayer`), where a GGUF is read
(adafuse/loading/gguf.py), and the model API a pass calls (`check_model`).
"""

import inspect

import torch
from packaging.version import Version

from adafuse.errors import BackendError

MIN_TRANSFORMERS = "5.23"  # older versions mis-tokenise the Gemma 3 GGUF or drop its <bos> (pyproject.toml)


def check_transformers() -> str:
    """The installed transformers' version, once the features the engine uses are checked; BackendError
    names every one that is missing."""
    import transformers
    from transformers import cache_utils, masking_utils, modeling_gguf_pytorch_utils, modeling_utils

    missing = []
    found = transformers.__version__
    if Version(found) < Version(MIN_TRANSFORMERS):
        missing.append(f"transformers >= {MIN_TRANSFORMERS} (installed: {found})")
    for where, names in [
        (transformers, ["AttentionInterface"]),
        (modeling_utils, ["ALL_ATTENTION_FUNCTIONS", "PreTrainedModel"]),
        (
            masking_utils,
            [
                "ALL_MASK_ATTENTION_FUNCTIONS",
                "AttentionMaskInterface",
                "create_causal_mask",
                "create_sliding_window_causal_mask",
            ],
        ),
        (cache_utils, ["DynamicCache", "DynamicLayer"]),
    ]:
        missing += [f"{where.__name__}.{name}" for name in names if not hasattr(where, name)]
    if hasattr(modeling_utils, "PreTrainedModel") and not hasattr(
        modeling_utils.PreTrainedModel, "set_attn_implementation"
    ):
        missing.append("PreTrainedModel.set_attn_implementation")
    layer = getattr(cache_utils, "DynamicLayer", None)
    if layer is not None and not all(
        hasattr(layer, name) for name in ("lazy_initialization", "update", "get_seq_length")
    ):
        missing.append("DynamicLayer.lazy_initialization / update / get_seq_length")
    if "GGUFReader" in vars(modeling_gguf_pytorch_utils):
        missing.append("a GGUF reader imported when a checkpoint loads (transformers imports it at module level)")
    mask_cache_arg = ""
    if hasattr(masking_utils, "create_causal_mask"):
        params = inspect.signature(masking_utils.create_causal_mask).parameters
        mask_cache_arg = next((name for name in ("cache", "past_key_values") if name in params), "")
        absent = [p for p in ("config", "inputs_embeds", "attention_mask", "position_ids") if p not in params]
        if not mask_cache_arg or absent:
            missing.append(f"create_causal_mask's parameters {absent + ([] if mask_cache_arg else ['cache'])}")
    if missing:
        raise BackendError(
            "the installed transformers lacks what the engine relies on: "
            + "; ".join(missing)
            + f". Install transformers>={MIN_TRANSFORMERS},<6 (pyproject.toml)"
        )
    return found


def check_model(model) -> None:
    """The model API the engine uses: a causal LM with a decoder body, a linear head and a KV-cache argument."""
    problems = []
    params = inspect.signature(model.forward).parameters
    if "cache" not in params and "past_key_values" not in params:
        problems.append("its forward takes neither `cache` nor `past_key_values`")
    if "position_ids" not in params:
        problems.append("its forward takes no `position_ids`")
    if not callable(getattr(model, "get_decoder", None)):
        problems.append("it has no get_decoder()")
    if not isinstance(model.get_output_embeddings(), torch.nn.Linear):
        problems.append("its output embeddings are not a torch.nn.Linear")
    if problems:
        name = type(model).__name__
        raise BackendError(f"model class {name} cannot be decoded by the engine: " + "; ".join(problems))
