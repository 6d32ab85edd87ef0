"""What Triton needs on a GPU node beyond its own wheel, told at start with the fix for each missing piece.

The first launch of a Triton kernel on a GPU compiles the kernel and builds a small C launcher for it: that needs a C
compiler (`$CC`, else gcc or clang on the PATH), the Python headers (Python.h) and a writable cache folder
(`$TRITON_CACHE_DIR`, else ~/.triton/cache). Where one is missing, every probe of our kernels raises and the backend
runs the stock kernels; the run's record says why (`problems`), and the backend says it once, in one line, at start.
The kernels' source is part of what their probe verdicts mean (`source_hash`).
"""

import hashlib
import importlib.util
import os
import shutil
import sysconfig
from pathlib import Path

from adafuse.backend.cuda import choice, kernels


def problems() -> list[str]:
    """Each missing piece of Triton's toolchain here, with its fix; empty where nothing is known to be missing."""
    if importlib.util.find_spec("triton") is None:
        return ["triton is not installed (pip install triton; CUDA builds of torch bring the one they need)"]
    found = []
    compiler = os.environ.get("CC")
    if compiler is not None and shutil.which(compiler) is None:
        found.append(f"CC={compiler} is not a program on the PATH (set CC to a C compiler, or unset it to use gcc)")
    elif compiler is None and not (shutil.which("gcc") or shutil.which("clang")):
        found.append("no C compiler for Triton's launcher (install gcc, e.g. `apt install gcc`, or set CC)")
    scheme = sysconfig.get_default_scheme()
    include = Path(sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"])
    if not (include / "Python.h").is_file():
        found.append(f"no Python.h in {include} (install the Python headers, e.g. `apt install python3-dev`)")
    cache = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    if not _writable(cache):
        found.append(f"Triton's cache {cache} cannot be written (set TRITON_CACHE_DIR to a writable folder)")
    return found


def _writable(folder: Path) -> bool:
    """Whether `folder` is, or can be made, a folder this process can write in."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    return existing is not None and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def source_hash() -> str:
    """The sha256 of the kernels' and their probes' source: a verdict holds for the code that was probed."""
    digest = hashlib.sha256()
    for module in (kernels, choice):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]
