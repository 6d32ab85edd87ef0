"""The seams a method works through, held by reading the source: the Session is the only keeper of an
example's text and stop state (a method changes them through its methods, never by assignment), the
Member is the only way to a tokenizer, and the authors' answer rules are one module that the scorers
can import without the methods' model code."""

import ast
from pathlib import Path

import pytest

from adafuse.methods.session import Session

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / "adafuse" / "methods" / "session.py"
# Where a tokenizer is held: a model's tokenisation wraps it, the server's prompt check holds copies of its own,
# loading makes it (the slow references in oracles/, which check the Member against the tokenizer itself, are
# outside the scanned folders). Everything else reaches it through `member.tokenisation`.
TOKENIZER_HOLDERS = {"adafuse/text/tokenisation.py", "adafuse/text/prompt_check.py", "adafuse/loading/pretrained.py"}


def python_files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def session_class() -> ast.ClassDef:
    (cls,) = [n for n in parse(SESSION).body if isinstance(n, ast.ClassDef) and n.name == "Session"]
    return cls


def state_attributes() -> set[str]:
    """Every attribute a Session (or the copy `solo` makes) sets on itself."""
    names = set()
    for node in ast.walk(session_class()):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for leaf in ast.walk(target) if target is not None else ():
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name):
                    if leaf.value.id in ("self", "alone"):
                        names.add(leaf.attr)
    return names


def test_the_session_keeps_its_state_private_and_shows_it_read_only():
    state = state_attributes()
    assert {"_text", "_stats", "_trace", "_output_ids"} <= state  # the walk finds what it must
    assert all(name.startswith("_") for name in state), sorted(state)
    for name in ("text", "rounds", "done", "tracing", "members", "request", "stop", "max_new_tokens"):
        shown = getattr(Session, name)
        assert isinstance(shown, property) and shown.fset is None, name


CODE_FOLDERS = ("adafuse", "baselines", "eval", "serve", "scripts", "tools", "oracles")


@pytest.mark.parametrize("path", python_files(*CODE_FOLDERS), ids=relative)
def test_no_code_outside_the_session_touches_its_private_state(path):
    if path == SESSION:
        return
    private = state_attributes()
    touched = [
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(parse(path))
        if isinstance(node, ast.Attribute) and node.attr in private
    ]
    assert not touched


@pytest.mark.parametrize("path", python_files("adafuse", "baselines", "eval", "serve"), ids=relative)
def test_a_tokenizer_is_reached_only_through_the_member(path):
    """No `x.tokenizer` (nor the Member's `detokenizer`) but an object's own (`self.tokenizer`: PairRM's
    DeBERTa tokenizer, the Detokenizer's): what a method needs of a member's tokenizer is its tokenisation's API."""
    if relative(path) in TOKENIZER_HOLDERS:
        return
    reached = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(parse(path))
        if isinstance(node, ast.Attribute)
        and node.attr in ("tokenizer", "detokenizer")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]
    assert not reached


def imported_roots(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", python_files("baselines"), ids=relative)
def test_the_methods_never_import_the_harness(path):
    assert "eval" not in imported_roots(path)


def test_the_authors_rules_are_plain_text_processing():
    """eval/paper_metrics.py imports them: the scorers must not load torch or a model to read a pred."""
    assert imported_roots(ROOT / "baselines" / "authors_rules.py") <= {"re"}
