"""The layers of the tree: the engine (adafuse/) imports no layer above it, its folders are its layers (each
imports only the layers below it: methods neither the engine loop nor a backend; nothing outside adafuse/backend/
its internals), no module imports one that imports it back, and hidden per-thread state lives only in the
backend; the installed packages never import the repository-only ones (tools/, oracles/, tests/), only tests
import tests/support/, no file edits sys.path, the runner and the server stay above the engine's facade, and the
methods reach the engine only through the `adafuse.methods` entry points."""

import ast
import subprocess
import sys

import pytest

from tests.support.paths import ROOT


def imported_modules(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def python_files(*folders: str) -> list:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def relative(path) -> str:
    return str(path.relative_to(ROOT))


def module_name(path) -> str:
    """The dotted name a file is imported as (a package's __init__ as the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", python_files("adafuse"), ids=relative)
def test_the_engine_imports_no_layer_above_it(path):
    above = {"baselines", "eval", "serve", "conf", "scripts", "tools", "oracles", "tests", "run"}
    assert not {name for name in imported_modules(path) if name.split(".")[0] in above}


def import_cycle(folder: str) -> list[str] | None:
    """A cycle among the imports of `folder`'s modules (those inside functions included, and a module imported as
    `from package import module`), or None."""
    modules = {module_name(path): path for path in python_files(folder)}

    def imports(path) -> set[str]:
        names = imported_modules(path)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
        return {name for name in names if name in modules}

    graph = {name: imports(path) for name, path in modules.items()}
    state: dict[str, str] = {}

    def cycle_from(name: str, trail: list[str]) -> list[str] | None:
        state[name] = "open"
        for nxt in sorted(graph[name]):
            if state.get(nxt) == "open":
                return trail + [name, nxt]
            if nxt not in state and (found := cycle_from(nxt, trail + [name])):
                return found
        state[name] = "done"
        return None

    cycles = [found for name in sorted(graph) if name not in state and (found := cycle_from(name, []))]
    return cycles[0] if cycles else None


def test_no_engine_module_imports_one_that_imports_it_back():
    """The engine's imports, those inside functions and type-checking blocks included, form no cycle."""
    cycle = import_cycle("adafuse")
    assert cycle is None, " -> ".join(cycle)


def test_no_tool_imports_one_that_imports_it_back():
    """Nor do the tools': what two share lives in a third."""
    cycle = import_cycle("tools")
    assert cycle is None, " -> ".join(cycle)


# adafuse/'s layers, bottom up, and the layers each may import (docs/algorithm.md draws them). A file at the top
# of adafuse/ is in the "base" layer (settings, errors, registries, the trace) unless it is the public face.
LAYERS = {
    "base": set(),
    "text": {"base"},
    "backend": {"base"},
    "member": {"base", "text", "backend"},
    "methods": {"base", "text", "member"},
    "engine": {"base", "member", "backend"},
    "loading": {"base", "backend"},
    "face": {"base", "text", "backend", "member", "methods", "engine", "loading"},
}
FACE = {"adafuse", "adafuse.ensemble"}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module in FACE:
        return "face"
    return parts[1] if len(parts) > 2 or parts[1] in LAYERS and parts[1] != "base" else "base"


@pytest.mark.parametrize("path", python_files("adafuse"), ids=relative)
def test_each_folder_of_the_engine_imports_only_the_layers_below_it(path):
    module = module_name(path)
    layer = layer_of(module)
    reached = {layer_of(name) for name in imported_modules(path) if name.split(".")[0] == "adafuse"} - {layer}
    assert reached <= LAYERS[layer], f"{module} ({layer}) imports {sorted(reached - LAYERS[layer])}"


def test_the_layers_are_the_folders():
    """Every sub-folder of adafuse/ is a layer of LAYERS, and every layer but the base and the face a folder."""
    folders = {path.name for path in (ROOT / "adafuse").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == set(LAYERS) - {"base", "face"}


OUTSIDE_BACKEND = [
    path
    for path in python_files("adafuse", "baselines", "eval", "serve")
    if not relative(path).startswith("adafuse/backend/")
]


@pytest.mark.parametrize("path", OUTSIDE_BACKEND, ids=relative)
def test_nothing_outside_the_backend_imports_its_internals(path):
    """The seam is `adafuse.backend` (its interface); its modules are its own (tests may look inside)."""
    inside = {name for name in imported_modules(path) if name.startswith("adafuse.backend.")}
    assert not inside


@pytest.mark.parametrize("path", OUTSIDE_BACKEND, ids=relative)
def test_no_per_thread_state_outside_the_backend(path):
    """What a forward pass does is decided by the forward context the backend sets (adafuse/backend/forward.py),
    not by state hidden in context variables or thread-locals elsewhere."""
    source = path.read_text()
    assert "ContextVar" not in source and "threading.local" not in source


OUTSIDE_MEMBER = [
    path
    for path in python_files("adafuse", "baselines", "eval", "serve")
    if not relative(path).startswith("adafuse/member/")
]
MEMBER_INTERNALS = {"prompts", "ledger"}  # a runner's store of prompt prefixes and its KV ledger


@pytest.mark.parametrize("path", OUTSIDE_MEMBER, ids=relative)
def test_nothing_outside_the_member_touches_its_stores_or_its_cache_module(path):
    """The scheduler, the executor and the methods ask a member's runner (adafuse/member/runner.py) what a prompt
    reads, what its read leaves and what the examples hold: the store of prefixes, the KV ledger and the cache
    module (adafuse/member/cache.py) are the member's (the backend reads a cache's layers it is handed)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    reached = [
        f"{ast.unparse(node)} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in MEMBER_INTERNALS and "runner" in ast.unparse(node.value)
    ]
    reached += sorted(name for name in imported_modules(path) if name == "adafuse.member.cache")
    assert not reached


@pytest.mark.parametrize("path", python_files("adafuse", "baselines", "eval", "serve"), ids=relative)
def test_only_the_install_module_changes_a_models_classes_or_transformers_registries(path):
    """What a backend changes in a model is made in one place, adafuse/backend/install.py, which takes it back too:
    no class swap elsewhere, and transformers' attention registries written only by the wrapper it routes through
    (adafuse/backend/attention.py `wrapped_attention`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    swaps = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Attribute) and t.attr == "__class__" for t in node.targets)
    ]
    registers = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Interface.register")
    ]
    assert not swaps or relative(path) == "adafuse/backend/install.py", swaps
    assert not registers or relative(path) == "adafuse/backend/attention.py", registers


SHIPPED = ["adafuse", "baselines", "eval", "serve", "conf", "hydra_plugins"]  # pyproject's packages


def test_the_installed_packages_never_import_the_repository_only_ones():
    repository_only = {"tools", "oracles", "tests"}
    found = {
        relative(path): names
        for path in python_files(*SHIPPED)
        if (names := {name for name in imported_modules(path) if name.split(".")[0] in repository_only})
    }
    assert not found


@pytest.mark.parametrize("path", python_files("scripts", "tools", "oracles"), ids=relative)
def test_scripts_never_import_the_tests(path):
    assert not {name for name in imported_modules(path) if name.split(".")[0] == "tests"}


def test_no_test_imports_another_test_module():
    """What tests share lives in tests/support/, oracles/ and tools/, or in conftest's fixtures."""
    found = {}
    for path in python_files("tests"):
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {f".{node.module}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
        names |= {
            name
            for name in imported_modules(path)
            if name.split(".")[0] == "tests" and not name.startswith("tests.support")
        }
        if names:
            found[relative(path)] = names
    assert not found


# The two files that load the authors' code from a directory the user names (their scripts, their pinned
# word2number): loading someone else's files is their job, not the project's own import plumbing.
LOADS_OUTSIDE_CODE = {"tools/authors_code.py", "tools/authors_scorers.py"}


def test_the_project_imports_itself_as_installed_never_through_sys_path_or_file_loaders():
    plumbing = []
    for path in python_files(*SHIPPED, "scripts", "tools", "oracles", "tests"):
        if relative(path) in LOADS_OUTSIDE_CODE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = ast.unparse(node.func)
                if target in {"sys.path.insert", "sys.path.append"} or node.func.attr == "spec_from_file_location":
                    plumbing.append(f"{relative(path)}:{node.lineno}: {target}")
    assert not plumbing


# What the runner (eval/, conf/, run.py) and the server (serve/) may import of the engine: the facade
# (`adafuse`: Ensemble, Request, Job, ...) and the settings, errors and registries; never the member, the
# scheduler, a session or a method's code. The server steps the engine loop through `Ensemble.engine`.
ENGINE_API = {"adafuse", "adafuse.config", "adafuse.errors", "adafuse.methods", "adafuse.registry"}
RUNNER = sorted(
    [*(ROOT / "eval").rglob("*.py"), *(ROOT / "serve").rglob("*.py"), *(ROOT / "conf").rglob("*.py"), ROOT / "run.py"]
)


@pytest.mark.parametrize("path", RUNNER, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runner_reaches_the_engine_only_through_its_public_api(path):
    engine = {name for name in imported_modules(path) if name.split(".")[0] == "adafuse"}
    assert engine <= ENGINE_API, f"{path.name} imports {sorted(engine - ENGINE_API)}: add a method to the facade"
    # Nor through an ensemble's members: the only `.members` it reads is a model pair's config.
    tree = ast.parse(path.read_text(), filename=str(path))
    reaches = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "members"
        and not (isinstance(node.value, ast.Attribute) and node.value.attr == "model_pair")
    ]
    assert not reaches, f"{path.name} reads an ensemble's members at line(s) {reaches}"


def test_methods_load_on_first_lookup_through_their_entry_points():
    probe = (
        "import sys\n"
        "from adafuse import Ensemble\n"
        "from adafuse.methods import METHODS\n"
        "assert {'adafuse', 'single', 'unite', 'deepen', 'sweetspan', 'llm_blender'} <= set(METHODS), set(METHODS)\n"
        "METHODS['adafuse']\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'baselines'], 'the engine imported a baseline'\n"
        "from baselines.unite import METHOD\n"
        "assert METHODS['unite'] is METHOD\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_missing_requirement_skips_here_and_fails_in_ci(require, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    require(True, "present")
    with pytest.raises(pytest.skip.Exception, match="absent"):
        require(False, "absent")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="absent"):
        require(False, "absent")


def calls(function: ast.AST) -> set[str]:
    return {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
    }


def test_a_test_skips_for_a_missing_package_only_through_require():
    """conftest's `require` is the one rule (a skip here, a failure in CI): no importorskip, and every
    function that looks a package up hands the answer to `require`."""
    found = []
    for path in python_files("tests"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef):
                called = calls(node)
                if "importorskip" in called or "find_spec" in called and "require" not in called:
                    found.append(f"{relative(path)}: {node.name}")
    assert not found, "use conftest's `require`"
