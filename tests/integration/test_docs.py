"""The docs check: README.md and docs/*.md say what is true of this tree.

Every relative link resolves (files, and #anchors to a heading of the page named). A fenced block after
`<!-- check: compose -->` holds commands that are composed exactly as they would run: `run.py` lines by
Hydra with the same overrides (a sweep expands to each of its values) and their typed settings built,
so an unknown key or a value out of range fails; `scripts/*.py`, `python -m tools.*`, `python -m eval.*` and
`python -m serve` lines run `--help`. A block after `<!-- runnable -->` is run line by line as written. A block after
`<!-- check: python -->` is executed. The rendered speed tables and the round's figure must equal what
their tools produce now. docs/testing.md describes the conventions.
"""

import ast
import contextlib
import io
import re
import runpy
import shlex
import subprocess
import sys
import unicodedata
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from conf.compose import compose_run
from eval.runner import settings_of
from tests.support.docs import FENCE, blocks
from tools import draw_round, render_docs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(?P<title>.+?) *$", re.MULTILINE)
PYTHON = {"python", ".venv/bin/python"}
# Scripts that take run.py's overrides rather than flags: composed like run.py.
TAKES_OVERRIDES = {"scripts/prepare_models.py"}
RUN_TIMEOUT_S = 120


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass
class Command:
    page: Path
    line: int
    text: str

    def __str__(self):
        return f"{rel(self.page)}:{self.line}: {self.text}"


def commands(marker: str) -> list[Command]:
    """Every command line of the blocks marked `marker`, a backslash-continued line joined."""
    found = []
    for page in PAGES:
        for first, body in blocks(page, marker):
            pending, start = "", first
            for number, line in enumerate(body.splitlines(), first):
                if not pending:
                    start = number
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                text = (pending + line).strip()
                pending = ""
                if text and not text.startswith("#"):
                    found.append(Command(page, start, text))
    return found


def words_of(command: Command) -> list[str]:
    """The command's words, its trailing comment and leading VAR=value assignments dropped."""
    words = shlex.split(command.text, comments=True)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words.pop(0)
    return words


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    title = title.strip().lower().replace("`", "")
    kept = "".join(c for c in title if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m["title"]) for m in HEADING.finditer(text)}


def links() -> list[tuple[Path, str]]:
    found = []
    for page in PAGES:
        for match in LINK.finditer(FENCE.sub("", page.read_text())):
            target = match["target"]
            if not re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                found.append((page, target))
    return found


@pytest.mark.parametrize("page,target", links(), ids=lambda x: rel(x) if isinstance(x, Path) else x)
def test_every_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    assert resolved.exists(), f"{rel(page)} links to {target}: no such file"
    if anchor:
        assert resolved.suffix == ".md", f"{rel(page)} links to an anchor in {path}, which is not a page"
        assert anchor in anchors(resolved), f"{rel(page)} links to #{anchor}: no such heading in {rel(resolved)}"


def expanded(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override lists a command composes: itself, or with `-m` each value of each sweep in turn (the
    other sweeps at their first value): every value is composed once, not every combination."""
    if not multirun:
        return [overrides]
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in parsed
    ]
    firsts = [c[0] for c in choices]
    runs = [firsts]
    for i, values in enumerate(choices):
        runs += [firsts[:i] + [v] + firsts[i + 1 :] for v in values[1:]]
    return runs


def compose_checked(overrides: list[str]) -> None:
    """Compose as run.py would and build the typed settings (the range checks); with hydra.* overrides,
    compose the hydra node too and resolve the launcher's settings."""
    settings_of(compose_run(*overrides))
    if any(o.startswith("hydra") for o in overrides):
        launcher = compose_run(*overrides, hydra=True).hydra.launcher
        OmegaConf.to_container(launcher, resolve=False)


_helped: dict[tuple[str, ...], tuple[int, str]] = {}


def run_help(target: str, module: bool) -> tuple[int, str]:
    """(exit status, output) of `python SCRIPT --help` or `python -m MODULE --help`, run in this process
    (the imports are this process's already, so each costs little) and once per target per session."""
    key = (target, str(module))
    if key not in _helped:
        out, argv = io.StringIO(), sys.argv
        sys.argv = [target, "--help"]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
                # runpy warns when the module is imported already (this test imports tools.render_docs);
                # --help only parses arguments, so running it a second time is harmless.
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                if module:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(str(ROOT / target), run_name="__main__")
            status = 0
        except SystemExit as stopped:
            status = stopped.code if isinstance(stopped.code, int) else 1
        finally:
            sys.argv = argv
        _helped[key] = (status, out.getvalue())
    return _helped[key]


def assert_help_works(command: Command, target: str, module: bool) -> None:
    status, output = run_help(target, module)
    assert status == 0 and "usage" in output, f"{command}: --help exited {status}\n{output[-2000:]}"


@pytest.mark.parametrize("command", commands("check: compose"), ids=str)
def test_every_checked_command_composes(command):
    words = words_of(command)
    assert words and words[0] in PYTHON, f"{command}: a checked block holds only python commands"
    if words[1] == "-m" and words[2].split(".")[0] in {"tools", "eval", "serve"}:
        assert_help_works(command, words[2], module=True)
        return
    script = words[1]
    assert (ROOT / script).is_file(), f"{command}: no such file {script}"
    if script == "run.py" or script in TAKES_OVERRIDES:
        args = words[2:]
        multirun = bool({"-m", "--multirun"} & set(args))
        args = [a for a in args if a not in ("-m", "--multirun")]
        if args[:1] == ["--cfg"]:
            args = args[2:]
        flags = [a for a in args if a.startswith("-")]
        assert not flags, f"{command}: the check does not know the flags {flags}"
        for overrides in expanded(args, multirun):
            compose_checked(overrides)
        return
    assert script.startswith("scripts/") and script.endswith(".py"), f"{command}: the check cannot read it"
    assert_help_works(command, script, module=False)


@pytest.mark.parametrize("command", commands("runnable"), ids=str)
def test_every_runnable_command_runs(command):
    words = words_of(command)
    if words[0] in PYTHON:
        words[0] = sys.executable
    done = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{command} exited {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


# A command of the Hugging Face hub's CLI as the docs, the configs and the messages write it: at a line's or a code
# span's start, or in parentheses; the program, then its command and subcommand.
HUB_CLI = re.compile(r"(?:^|[`(])(?P<program>huggingface-cli|hf) (?P<words>[a-z][a-z-]*(?: [a-z][a-z-]*)?)", re.M)


def hub_cli_commands() -> list[tuple[str, str, list[str]]]:
    """(file, program, its words) for every hub CLI command in the pages, the configs and the shipped code."""
    files = [*PAGES, *sorted((ROOT / "conf").rglob("*.yaml"))]
    files += [path for folder in ("adafuse", "eval", "serve") for path in sorted((ROOT / folder).rglob("*.py"))]
    return [
        (rel(path), match["program"], match["words"].split())
        for path in files
        for match in HUB_CLI.finditer(path.read_text())
    ]


@pytest.mark.parametrize(
    "file, program, words", hub_cli_commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else x
)
def test_every_hub_cli_command_written_here_is_one_the_installed_hub_has(file, program, words):
    """huggingface-hub >= 1 (which transformers >= 5.23 needs) has `hf` only: `huggingface-cli login` is gone."""
    executable = Path(sys.executable).parent / program
    assert executable.is_file(), f"{file}: `{program}` is not a command of the installed huggingface-hub (`hf` is)"
    done = subprocess.run([str(executable), *words, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{file}: `{program} {' '.join(words)}` is not a command: {done.stderr[-500:]}"


def test_the_checks_find_commands_on_every_page_that_marks_them():
    """A marker the parser misses (a typo, a blank line before the fence) would check nothing, silently."""
    for page in PAGES:
        marked = len(re.findall(r"^<!-- (?:check: \w+|runnable) -->$", page.read_text(), re.MULTILINE))
        found = sum(len(blocks(page, m)) for m in ("check: compose", "check: python", "runnable"))
        assert found == marked, f"{rel(page)}: {marked} markers, {found} of them before a fenced block"


def test_a_sweep_expands_to_each_value_once():
    runs = expanded(["task=nq,squad", "method.tau=0.5,0.7,0.9", "trace=true"], multirun=True)
    assert runs == [
        ["task=nq", "method.tau=0.5", "trace=true"],
        ["task=squad", "method.tau=0.5", "trace=true"],
        ["task=nq", "method.tau=0.7", "trace=true"],
        ["task=nq", "method.tau=0.9", "trace=true"],
    ]


def test_a_bad_override_fails_the_compose_check():
    with pytest.raises(Exception, match="tau"):
        compose_checked(["method.tau=-1"])
    with pytest.raises(Exception, match="nope"):
        compose_checked(["task=nope"])


def test_the_heading_slugs_follow_github():
    assert slug("The authors' code: `method=adafuse_code`") == "the-authors-code-methodadafuse_code"
    assert (
        slug("Implementation choices (where the spec leaves one)") == "implementation-choices-where-the-spec-leaves-one"
    )


def test_the_bench_tables_are_rendered_from_the_bench_files():
    pages = render_docs.pages()
    assert render_docs.DOCS_DIR / "speed.md" in pages
    for path in pages:
        page = path.read_text()
        assert render_docs.render(page) == page, f"{path} is out of date: run python -m tools.render_docs"


def test_a_marker_without_a_renderer_is_an_error_and_unknown_bench_files_are_listed(tmp_path):
    with pytest.raises(render_docs.RenderError, match="bench:nope names no renderer"):
        render_docs.render("<!-- bench:nope -->\n<!-- /bench -->", tmp_path)
    (tmp_path / "new_section.json").write_text("{}")
    page = render_docs.render("<!-- bench:unrendered -->\n<!-- /bench -->", tmp_path)
    assert "`results/bench/new_section.json`" in page


def test_a_measurement_only_a_gpu_makes_says_so_until_its_file_exists(tmp_path):
    """The GPU check's block renders its `absent` text while results/bench/gpu_check.json does not exist; any other
    missing file stays an error."""
    page = render_docs.render("<!-- bench:gpu-check -->\n<!-- /bench -->", tmp_path)
    assert render_docs.GPU_CHECK_ABSENT in page
    with pytest.raises(render_docs.RenderError, match="memory.json, which does not exist"):
        render_docs.render("<!-- bench:memory -->\n<!-- /bench -->", tmp_path)


def test_the_round_figure_is_what_its_tool_draws():
    assert draw_round.OUT.read_text() == draw_round.draw(), "run python -m tools.draw_round"


@pytest.mark.slow
@pytest.mark.parametrize(
    "page,first,code",
    [
        pytest.param(page, first, body, id=f"{rel(page)}:{first}")
        for page in PAGES
        for first, body in blocks(page, "check: python")
    ],
)
def test_every_checked_python_block_runs(page, first, code, capsys):
    """The block runs, and a `print(...)  # 'text'` line prints the text its comment shows."""
    exec(compile(code, f"{rel(page)}:{first}", "exec"), {"__name__": "docs"})
    printed = capsys.readouterr().out.splitlines()
    shown = [m[1] for m in re.finditer(r"^print\(.*\)  # ('.*'|\".*\")$", code, re.MULTILINE)]
    for literal in shown:
        assert ast.literal_eval(literal) in printed, f"{rel(page)}:{first}: printed {printed}, the page shows {literal}"
