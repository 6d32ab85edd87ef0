"""The committed Table 1 and figure data (results/grid) are what scripts/make_table.py and
scripts/make_figures.py make of the committed runs now: each regenerated into a fresh folder and
compared file by file. No model loads; Table 1's bootstrap scores BLEU on 1,000 resamples of every FLORES run
from each sentence's n-gram counts (eval/bootstrap.py)."""

import pytest

from tests.support.paths import ROOT
from tests.support.run_in_process import run_script

GRID = ROOT / "results" / "grid"


@pytest.mark.parametrize(
    "args, files",
    [
        ([], ["table1.md", "table1.tex", "table1.csv"]),
        (["--metric", "paper", "--paper"], ["table1_paper.md", "table1_paper.tex", "table1_paper.csv"]),
    ],
    ids=["standard", "paper"],
)
def test_the_committed_table_is_what_make_table_makes_of_the_committed_runs(args, files, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the CSV names each run's folder as the command line did: results/grid/...
    done = run_script("make_table", "results/grid", *args, "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for name in files:
        assert (tmp_path / name).read_text() == (GRID / name).read_text(), f"results/grid/{name} is stale"


def test_the_committed_figures_data_is_what_make_figures_makes_of_the_committed_runs(tmp_path):
    done = run_script("make_figures", str(GRID), "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    committed = sorted(p.name for p in (GRID / "figures").glob("*.csv"))
    assert committed == sorted(p.name for p in tmp_path.glob("*.csv"))
    for name in committed:
        assert (tmp_path / name).read_text() == (GRID / "figures" / name).read_text(), f"figures/{name} is stale"
