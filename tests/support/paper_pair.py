"""The paper's pair in shape (tools/make_paper_pair.py): Llama-3.1-8B-Instruct and
Mistral-7B-Instruct-v0.3 as the hub lays them out, with their real tokenizers and tiny random
bfloat16 weights. Built once per version of the script and cached under
`$ADAFUSE_CACHE/paper_pair/<key>/` (default ~/.cache/adafuse), keyed by the script's bytes and the
torch and transformers versions that write the files; a build takes about 20 seconds.

Run the paper's main command on it with `overrides(dirs)`:

    python run.py model_pair=llama_mistral model_pair.members.m0.path=DIR/llama31_8b_instruct \\
        model_pair.members.m1.path=DIR/mistral7b_instruct_v03 task=nq task.limit=3

Where the hub's `tokenizer_config.json` of Mistral-7B-Instruct-v0.3 stands on `legacy`: we found no
public copy of that exact file to quote (the repository is gated). What we found: the hub's
tokenizer.json of that model (mistralai/Mistral-7B-Instruct-v0.3@c170c708c41d, sha256 e553af6f...,
1,961,548 bytes, pinned in a public registry of official tokenizer files), which the build reproduces
byte for byte, pre-tokenizes with Metaspace, prepend_scheme "first", split false, and no normalizer:
what transformers' converter writes for legacy=False (legacy=True writes prepend_scheme "always").
Repositories saved from it since (e.g. trl-internal-testing/tiny-MistralForCausalLM-0.2) carry
`"legacy": false` in tokenizer_config.json. So we write `"legacy": false`. With transformers 5.x it
decides nothing: a directory whose config.json says model_type "mistral" loads as a TokenizersBackend
straight from tokenizer.json, and loading with legacy=True gives the same ids
(tests/engine/test_paper_pair.py).
"""

from pathlib import Path

from tools import make_paper_pair

NAMES = ("llama31_8b_instruct", "mistral7b_instruct_v03")


def paper_pair_dir(cache_dir: Path | None = None) -> Path:
    """The directory holding both shaped models, built on first use (tools/make_paper_pair.py `cached`).

    Raises SystemExit (from the script) when llama-models or mistral-common is not installed.
    """
    return make_paper_pair.cached(cache_dir)


def overrides(root: Path) -> list[str]:
    """Command-line overrides that point the paper's pair (model_pair=llama_mistral) at the shaped models."""
    return [f"model_pair.members.m{i}.path={root / name}" for i, name in enumerate(NAMES)]
