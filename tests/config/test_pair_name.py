"""A pair file of your own that kept another pair's name is refused before its runs write anything: its results would
land in that pair's folders (tools/bad_inputs.py "pair_name_taken"). Your own pair and task files may live outside the
checkout, in a folder Hydra searches too (hydra.searchpath), as docs/your_own.md shows."""

import subprocess
import sys

import pytest

from adafuse.errors import ConfigError
from conf.compose import compose_run
from conf.schema import check_pair_name
from tests.support.bad_inputs import bad_input, pattern, prepared
from tests.support.paths import ROOT

CASE = bad_input("pair_name_taken")


def test_run_py_refuses_a_pair_named_after_another_and_writes_nothing(tmp_path):
    with prepared(CASE, tmp_path):
        args = [a.format(dir=tmp_path) for a in CASE.args]
        command = [sys.executable, str(ROOT / "run.py"), *args, "task.limit=1", "wandb.mode=disabled"]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stdout + done.stderr
        (line,) = (done.stdout + done.stderr).splitlines()
        assert pattern(f"{CASE.error}: {CASE.message}", tmp_path).search(line), line
        assert not (tmp_path / "results").exists()

        grid = [sys.executable, str(ROOT / "scripts" / "run_grid.py"), "--dry-run", *args]
        planned = subprocess.run(grid, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert planned.returncode != 0 and pattern(CASE.message, tmp_path).search(planned.stderr), planned.stderr


def test_a_pair_of_your_own_with_its_own_name_composes_from_your_folder(tmp_path):
    with prepared(CASE, tmp_path):
        own = tmp_path / "conf" / "model_pair" / "my_pair.yaml"
        own.write_text(own.read_text().replace("name: llama_mistral", "name: my_pair"))
        cfg = compose_run(f"hydra.searchpath=[file://{tmp_path}/conf]", "model_pair=my_pair", hydra=True)
    check_pair_name(cfg.model_pair.name, cfg.hydra.runtime.choices.model_pair)
    assert cfg.hydra.run.dir == "results/nq/adafuse/my_pair/default"


def test_a_pair_renamed_on_the_command_line_is_its_own():
    check_pair_name("llama_mistral_in_shape", "llama_mistral")  # model_pair.name=...: runs of their own
    with pytest.raises(ConfigError, match="the name of conf/model_pair/tiny.yaml"):
        check_pair_name("tiny", "small")
