"""What Triton needs on a GPU node beyond its wheel (adafuse/backend/cuda/toolchain.py): each missing piece named
with its fix, said once at the CUDA backend's start; the kernels' source part of their probe verdicts' store."""

import logging
import sysconfig

import pytest

from adafuse.backend.cuda import available, toolchain
from adafuse.backend.probe_store import ProbeStore


@pytest.fixture
def here(require):
    """What this machine lacks, before a test takes anything away."""
    require(available(), "triton")
    return toolchain.problems()


def test_a_compiler_named_by_cc_that_is_not_there_is_named(here, monkeypatch):
    monkeypatch.setenv("CC", "/nowhere/cc")
    assert [p for p in toolchain.problems() if p not in here] == [
        "CC=/nowhere/cc is not a program on the PATH (set CC to a C compiler, or unset it to use gcc)"
    ]


def test_no_compiler_on_the_path_is_named_with_its_fix(here, monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert [p for p in toolchain.problems() if p not in here] == [
        "no C compiler for Triton's launcher (install gcc, e.g. `apt install gcc`, or set CC)"
    ]


def test_missing_python_headers_are_named_with_their_fix(here, monkeypatch, tmp_path):
    monkeypatch.setattr(sysconfig, "get_paths", lambda scheme=None: {"include": str(tmp_path)})
    assert [p for p in toolchain.problems() if p not in here] == [
        f"no Python.h in {tmp_path} (install the Python headers, e.g. `apt install python3-dev`)"
    ]


def test_a_triton_cache_that_cannot_be_written_is_named(here, monkeypatch, tmp_path):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(blocked / "cache"))
    assert [p for p in toolchain.problems() if p not in here] == [
        f"Triton's cache {blocked / 'cache'} cannot be written (set TRITON_CACHE_DIR to a writable folder)"
    ]


def test_the_backend_says_what_is_missing_once_at_start_and_probes_no_kernel_of_ours(here, monkeypatch, caplog):
    from adafuse.backend.cuda.backend import CudaBackend

    monkeypatch.setenv("CC", "/nowhere/cc")
    with caplog.at_level(logging.WARNING, logger="adafuse.backend.cuda.backend"):
        backend = CudaBackend("cuda", store=ProbeStore(None))
    (line,) = [r.getMessage() for r in caplog.records if "cannot run here" in r.getMessage()]
    assert "CC=/nowhere/cc is not a program on the PATH" in line and "\n" not in line
    assert backend.toolchain == toolchain.problems()


def test_edited_kernels_read_another_store(monkeypatch, tmp_path):
    """A verdict holds for the source that was probed: the kernels' hash names the store."""
    from adafuse.backend.cuda import kernels

    before = toolchain.source_hash()
    edited = tmp_path / "kernels.py"
    edited.write_text(open(kernels.__file__).read().replace("LINEAR_BLOCK_K = 64", "LINEAR_BLOCK_K = 32"))
    monkeypatch.setattr(kernels, "__file__", str(edited))
    after = toolchain.source_hash()
    assert after != before
    assert ProbeStore.for_gpu("cpu", before).path != ProbeStore.for_gpu("cpu", after).path
