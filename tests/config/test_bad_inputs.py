"""Every bad input of tools/bad_inputs.py is refused with its one named line, before any model loads where
the input needs none, and a refused run changes nothing on disk: a run that holds the directory goes on."""

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
from lm_eval.utils import simple_parse_args_string

import eval.runner
from adafuse.errors import AdaFuseError
from conf.compose import compose_run
from eval.lm_harness import AdaFuseLM
from eval.report.__main__ import main as report
from eval.runner import main
from tests.support.bad_inputs import FAST, bad_input, pattern, prepared
from tests.support.paths import ROOT
from tools.bad_inputs import CASES, BadInput

QUIET = ("wandb.mode=disabled", "progress=false")


def cases(tool: str) -> list:
    """The tool's cases that this file tries (not those another test tries: `tried_in`)."""
    return [
        pytest.param(case, id=case.key, marks=[pytest.mark.slow] if case.slow else [])
        for case in CASES
        if case.tool == tool and case.tried_in is None
    ]


def on_disk(folder: Path) -> dict[str, tuple]:
    """Every file below `folder` but lock files: its bytes and which version of it this is (a file replaced by
    one with the same bytes is another inode, and would end a run admitted under the first)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.endswith(".lock"):
            stat = path.stat()
            found[str(path.relative_to(folder))] = (path.read_bytes(), stat.st_ino, stat.st_mtime_ns)
    return found


def formatted(case: BadInput, folder: Path) -> list[str]:
    return [a.format(dir=folder) for a in case.args]


def assert_refused_as_written(case: BadInput, err: BaseException, folder: Path) -> None:
    assert type(err).__name__ == case.error, err
    assert pattern(case.message, folder).fullmatch(str(err)), f"{err}\n!=\n{case.message}"


@pytest.mark.parametrize("case", cases("run.py"))
def test_run_py_refuses_each_bad_input_in_its_line_and_changes_nothing_on_disk(case, tmp_path):
    with prepared(case, tmp_path):
        before, loaded = on_disk(tmp_path), set(eval.runner._LOADED)
        overrides = formatted(case, tmp_path)
        quiet = [q for q in QUIET if not any(o.startswith(q.split("=")[0]) for o in overrides)]
        with pytest.raises(AdaFuseError) as refused:
            main(compose_run(*overrides, *quiet), Path(case.run_dir.format(dir=tmp_path)))
        assert_refused_as_written(case, refused.value, tmp_path)
        assert on_disk(tmp_path) == before
        if not case.slow:  # (loading a pair drops the runner's other models: no entry may be new)
            assert set(eval.runner._LOADED) <= loaded, "a model was loaded"


@pytest.mark.parametrize("case", cases("eval.report"))
def test_the_report_refuses_each_bad_input_in_its_line_before_any_work(case, tmp_path):
    with prepared(case, tmp_path):
        before = on_disk(tmp_path)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert report(formatted(case, tmp_path)) == 2
        (line,) = err.getvalue().splitlines()
        assert pattern(f"error: {case.message}", tmp_path).fullmatch(line), line
        assert on_disk(tmp_path) == before


@pytest.mark.parametrize("case", cases("adafuse-lm-eval"))
def test_the_lm_eval_model_refuses_each_bad_argument_before_any_weights_load(case, tmp_path):
    loaded = set(eval.runner._LOADED)
    (model_args,) = case.args
    with pytest.raises(AdaFuseError) as refused:
        AdaFuseLM(**simple_parse_args_string(model_args))
    assert_refused_as_written(case, refused.value, tmp_path)
    assert set(eval.runner._LOADED) <= loaded


def test_every_other_case_is_tried_by_the_test_it_names():
    for case in CASES:
        if case.tool in FAST:
            assert case.tried_in is None, case.key
        elif case.tried_in is None:
            assert case.tool == "adafuse-lm-eval" and len(case.args) == 1, case.key  # model arguments, tried above
        else:
            assert f'"{case.key}"' in (ROOT / case.tried_in).read_text(), f"{case.tried_in} does not try {case.key}"


def run_py(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "run.py"), *overrides, *QUIET]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_run_py_prints_a_refusal_as_one_line_exits_2_and_leaves_no_folder_behind(tmp_path):
    done = run_py(tmp_path, "method.tau=-0.1", f"hydra.run.dir={tmp_path}/results/nq/run")
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].endswith("ConfigError: tau must be >= 0 (tau > 1 means 'never confident'), got -0.1")
    assert not (tmp_path / "results").exists()  # Hydra had created it, and its records and log


def test_a_run_refused_at_a_busy_shard_leaves_the_run_that_holds_it_as_it_was(tmp_path):
    """The run directory's holder was admitted, its models still loading; a second run with other settings
    is refused at the shard's claim, and writes nothing there: no config.yaml of its own (the holder would
    die at its next write), no Hydra records, no line in the holder's log."""
    case = bad_input("busy_shard")
    with prepared(case, tmp_path):
        (tmp_path / "run" / "run.log").write_text("[holder] loading\n")
        before = on_disk(tmp_path)
        done = run_py(tmp_path, *formatted(case, tmp_path), f"hydra.run.dir={tmp_path}/run")
        assert done.returncode == 2, done.stdout + done.stderr
        assert "ShardBusyError: " in done.stdout + done.stderr and "Traceback" not in done.stderr
        assert on_disk(tmp_path) == before


def test_a_run_refused_after_claiming_its_shard_leaves_no_folder_behind(tmp_path):
    """A model file is checked after the run claims its shard (a lock file in the run directory): the refused run
    gives the claim back and removes its lock file, so the folders it created go too."""
    case = bad_input("missing_gguf")
    with prepared(case, tmp_path):
        done = run_py(tmp_path, *formatted(case, tmp_path), f"hydra.run.dir={tmp_path}/results/nq/run")
    assert done.returncode == 2 and "ModelFileError: " in done.stdout + done.stderr, done.stdout + done.stderr
    assert not (tmp_path / "results").exists(), sorted(str(p) for p in (tmp_path / "results").rglob("*"))
