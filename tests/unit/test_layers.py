"""The layers of the tree: the engine (adafuse/) imports no layer above it, scripts never import the
tests, the runner stays above the engine's facade, and the methods reach the engine only through the
`adafuse.methods` entry points."""

import ast
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def imported_modules(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "adafuse").glob("*.py")), ids=lambda p: p.name)
def test_the_engine_imports_no_layer_above_it(path):
    above = {"baselines", "eval", "conf", "scripts", "tests", "run"}
    assert not {name for name in imported_modules(path) if name.split(".")[0] in above}


@pytest.mark.parametrize("path", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_scripts_never_import_the_tests(path):
    assert not {name for name in imported_modules(path) if name.split(".")[0] == "tests"}


# What the runner (eval/, conf/, run.py) may import of the engine: the facade (`adafuse`: Ensemble,
# Request, ...) and the settings, errors and registries; never the member, the scheduler, a session or
# a method's code.
ENGINE_API = {"adafuse", "adafuse.config", "adafuse.errors", "adafuse.methods", "adafuse.registry"}
RUNNER = sorted([*(ROOT / "eval").rglob("*.py"), *(ROOT / "conf").rglob("*.py"), ROOT / "run.py"])


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
