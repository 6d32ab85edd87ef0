"""Run a script of scripts/ in the test process, as its command line would (no interpreter start-up, no
second import of pandas and torch): its argv, exit status, stdout, and stderr with its log lines."""

import contextlib
import importlib
import io
import logging
import sys
from dataclasses import dataclass

from tests.support.paths import ROOT


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def run_script(name: str, *args: str) -> Done:
    path = ROOT / "scripts" / f"{name}.py"
    module = importlib.import_module(f"scripts.{name}")
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level, argv = root.handlers[:], root.level, sys.argv
    handler = logging.StreamHandler(err)  # the scripts' basicConfig(format="%(message)s"), into err
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.handlers, sys.argv = [handler], [str(path), *args]
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = module.main()
            except SystemExit as exit:  # as the interpreter reports it: a message goes to stderr, status 1
                code = exit.code
                if code is not None and not isinstance(code, int):
                    print(code, file=err)
                    code = 1
    finally:
        root.handlers, sys.argv = handlers, argv
        root.setLevel(level)
    return Done(code or 0, out.getvalue(), err.getvalue())
