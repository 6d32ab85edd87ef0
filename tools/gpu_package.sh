#!/usr/bin/env bash
# The GPU check (tools/gpu_check.py) on a bare GPU machine without network, beside this checkout, in two steps:
#
#   bash tools/gpu_package.sh [DATA_DIR]   # here, with network to PyPI: gather gpu_package/ (git-ignored)
#   bash tools/gpu_package.sh --run [ARGS] # there, from the checkout's root: the wheels, then the check with ARGS
#
# gpu_package/ holds the wheels the machine's image lacks (run.py's among them: the check decodes through run.py,
# Hydra and the runner), the two tokenizer files that tools/make_paper_pair.py converts, and the NQ and GSM8K files
# the prompts are made of (DATA_DIR: $ADAFUSE_DATA_DIR, else ../shared/data). The image (docs/speed.md): Python 3.12, torch 2.11
# + CUDA 13, Triton 3.6, transformers 5.17, accelerate, tokenizers, safetensors, sentencepiece, protobuf, psutil,
# sacrebleu, pandas, numpy. Each wheel is the version this checkout's venv runs (its tests ran on them), for CPython
# 3.12 on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGE=gpu_package
if [ "${1:-}" = "--run" ]; then
    shift
    SITE=${SITE:-/tmp/site} # where the wheels go: beside the image's packages, before them on the path
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$PACKAGE"/wheels/*.whl
    export PYTHONPATH=$SITE:$PWD/$PACKAGE/tokenizer_sources${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    exec python3 -m tools.gpu_check --data-dir "$PACKAGE/data" "$@"
fi
PY=${PYTHON:-.venv/bin/python}
DATA=${1:-${ADAFUSE_DATA_DIR:-../shared/data}}
LIMIT_MIB=60
# transformers >= 5.23 and what its requirements need beyond the image (each wheel's Requires-Dist:
# huggingface-hub 2.4 needs click >= 8.4.2, hf-xet >= 1.6 and httpx2; httpx2 needs httpcore2, idna >= 3.18
# and truststore; transformers needs kernels 0.19, which needs tomlkit); the Hydra config the prompts
# are composed with, and the submitit launcher that this project's Hydra plugins import when Hydra scans them
# (it imports submitit only to launch); word2number (eval/paper_metrics.py, imported with the tasks)
WHEELS=(transformers huggingface-hub httpx2 httpcore2 click hf-xet kernels truststore tomlkit idna hydra-core omegaconf
    hydra-submitit-launcher)
SDISTS=(antlr4-python3-runtime word2number) # PyPI has only their sources: built into wheels here

rm -rf "$PACKAGE"
mkdir -p "$PACKAGE/wheels" "$PACKAGE/tokenizer_sources" "$PACKAGE/data"
pinned() { "$PY" -c 'import sys; from importlib.metadata import version; print(*(f"{n}=={version(n)}" for n in sys.argv[1:]))' "$@"; }
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$PACKAGE/wheels" $(pinned "${WHEELS[@]}")
python3 -m pip wheel --quiet --no-deps -w "$PACKAGE/wheels" $(pinned "${SDISTS[@]}")
# The project itself: its entry points register the methods (adafuse/methods/__init__.py); the code run is the checkout's.
python3 -m pip wheel --quiet --no-deps -w "$PACKAGE/wheels" .
# llama-models' and mistral-common's tokenizer files alone, where make_paper_pair.source() looks for them
# (each checked against its pinned sha256, here and again there), not the packages (13 MB).
"$PY" - "$PACKAGE/tokenizer_sources" <<'EOF'
import importlib.util
import shutil
import sys
from pathlib import Path

from tools import make_paper_pair

for name in ("llama3_tiktoken", "mistral_v3_spm"):
    package = make_paper_pair.SOURCES[name][0]
    path = make_paper_pair.source(name)
    inside = path.relative_to(importlib.util.find_spec(package).submodule_search_locations[0])
    (Path(sys.argv[1]) / package / inside).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, Path(sys.argv[1]) / package / inside)
EOF
# conf/task/nq.yaml's and gsm8k.yaml's local files: the questions, the problems and the exemplars' pools
cp -r --no-preserve=mode "$DATA/nq_open" "$DATA/gsm8k" "$PACKAGE/data/"
du -sh "$PACKAGE"/*
size=$(du -sm "$PACKAGE" | cut -f1)
echo "$PACKAGE: $size MiB (at most $LIMIT_MIB; the machine takes 64 MiB with the checkout)"
if [ "$size" -ge "$LIMIT_MIB" ]; then
    echo "$PACKAGE is $size MiB: over the $LIMIT_MIB MiB it must fit in" >&2
    exit 1
fi
