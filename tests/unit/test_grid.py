"""The grid's plan (eval/grid.py, scripts/run_grid.py --dry-run): which multiruns run Table 1 and the ablations, each
run's directory as its job will name it, what a results folder already holds, the hours left, and the settings the
grid refuses. No model loads."""

import pytest
import yaml

from adafuse.errors import ConfigError
from eval.grid import AblationPart, GridConf, check_command_line, estimate, load_grid, plan, sweeps
from tests.support.paths import SHARED_DATA
from tests.support.run_in_process import run_script
from tests.support.runs import pattern, write_run


def test_the_papers_grid_is_table_1_under_both_protocols_and_every_ablation_point_once():
    planned = sweeps(load_grid("paper"), ["table", "paper", "ablations"], members=2, limit=None)
    runs = {part: 0 for part in ("table", "paper", "ablations")}
    for sweep in planned:
        count = 1
        for values in sweep.swept.values():
            count *= len(values)
        runs[sweep.part] += count
    # 6 tasks x (2 single models + 5 methods); x (2 + 6) under protocol=paper; 2 tasks x 15 knob values
    assert runs == {"table": 42, "paper": 48, "ablations": 30}
    assert all("protocol=paper" in s.fixed for s in planned if s.part == "paper")
    assert all(s.fixed[-1] == "task.limit=null" for s in planned)  # every example, as the paper scores them
    # the ablations' middle point is Table 1's AdaFuse run: planned once, by the table
    alone = sweeps(load_grid("paper"), ["ablations"], members=2, limit=5)
    assert [s.swept for s in alone if not any(k.startswith("method.") for k in s.swept)] == [{"task": ["nq", "gsm8k"]}]


def test_tasks_of_one_slice_share_a_multirun():
    planned = sweeps(load_grid("cpu"), ["table"], members=2, limit=None)
    assert [(s.fixed[-1], s.swept["task"]) for s in planned if "method" in s.swept] == [
        ("task.limit=100", ["nq", "squad", "triviaqa"]),
        ("task.limit=50", ["gsm8k", "flores_en_de", "flores_de_en"]),
    ]


@pytest.mark.parametrize(
    "knobs, phrase",
    [({"tau": [0.5, 0.7]}, "holds 0.7, the default"), ({"taux": [0.5]}, "'taux' is not a knob of AdaFuse")],
)
def test_an_ablation_of_the_default_or_of_no_knob_is_refused(knobs, phrase):
    with pytest.raises(ConfigError, match=phrase):
        GridConf(ablations=AblationPart(tasks=["nq"], knobs=knobs))


def test_a_grid_that_does_not_exist_lists_the_grids():
    with pytest.raises(
        ConfigError, match="no grid 'nope' in conf/grid/ or the search path; conf/grid/ holds: cpu, paper"
    ):
        load_grid("nope")


@pytest.mark.parametrize(
    "override, phrase",
    [("method.tau=0.3,0.5", "the grid sweeps itself"), ("task=nq", "the grid sets task"), ("task.limit=5", "--limit")],
)
def test_the_command_line_sets_one_value_per_setting_and_none_the_grid_sets(override, phrase):
    with pytest.raises(ConfigError, match=phrase):
        check_command_line(["model_pair=llama_mistral", override])


def test_the_plan_names_each_run_as_its_job_will_and_resumes_what_a_folder_holds(tmp_path):
    grid = GridConf(ablations=AblationPart(tasks=["nq"], knobs={"tau": [0.3, 0.9], "diversity": [False]}))
    command_line = [f"results_dir={tmp_path}", f"data.dir={SHARED_DATA}"]
    (tau, diversity) = plan(sweeps(grid, ["ablations"], 2, limit=4)[:2], command_line)
    # Hydra writes a swept value its own way in the job's overrides, so in its run directory: false as False
    assert [r.run_dir.name for r in diversity.runs] == ["method.diversity=False"]
    assert [r.examples for r in tau.runs] == [4, 4] and tau.multiruns() == [tau.overrides]

    write_run(tmp_path, "nq", "adafuse", pattern(4, 2), "method.tau=0.3")  # a finished point
    (tau,) = plan(sweeps(grid, ["ablations"], 2, limit=4)[:1], command_line)
    assert [r.finished for r in tau.runs] == [True, False]
    assert tau.multiruns() == [tau.runs[1].overrides]  # the rest of the sweep, its runs one by one

    (grown,) = plan(sweeps(grid, ["ablations"], 2, limit=6)[:1], command_line)
    assert [(r.finished, r.done, r.examples) for r in grown.runs] == [(False, 4, 6), (False, 0, 6)]


def test_the_hours_left_come_from_rates_measured_on_the_same_device(tmp_path):
    grid = GridConf(ablations=AblationPart(tasks=["nq"], knobs={"tau": [0.3, 0.9]}))
    command_line = [f"results_dir={tmp_path}", f"data.dir={SHARED_DATA}"]
    run = write_run(tmp_path, "nq", "adafuse", pattern(4, 2), "method.tau=0.3")  # 0.5 s per example
    (run / "metrics.json").unlink()  # started, not finished: 4 of 100 examples
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["runtime"] = {"models": [{"name": "smollm2_135m", "device": "cuda:0"}]}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (tau,) = plan(sweeps(grid, ["ablations"], 2, limit=100)[:1], command_line)
    on_gpus = estimate(tau.runs, "cuda", devices_per_job=2)
    # its own 96 examples left and the other point's 100 at its rate, on 2 GPUs per job
    assert (on_gpus.measured, on_gpus.unmeasured) == (2, 0)
    assert on_gpus.hours == pytest.approx((96 + 100) * 0.5 * 2 / 3600)
    assert estimate(tau.runs, "cpu", devices_per_job=1).measured == 0  # a GPU's rate says nothing of a CPU


def test_the_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    done = run_script(
        "run_grid",
        "--dry-run",
        "--parts",
        "ablations",
        "--limit",
        "3",
        f"results_dir={tmp_path}",
        f"data.dir={SHARED_DATA}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Launcher: slurm, one SLURM job per run: 1 GPU, 8 CPUs, 64 GB, 240 min" in done.stdout
    assert "[ablations] run.py -m method=adafuse task.limit=3 task=nq,gsm8k method.tau=0.1,0.3,0.5,0.9" in done.stdout
    assert "32 runs: 0 finished, 32 to run, 96 examples to decode" in done.stdout
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_bad_command_line_is_refused_before_anything_is_planned():
    done = run_script("run_grid", "--dry-run", "method.tau=0.3,0.5")
    assert done.returncode != 0 and "run_grid: method.tau=0.3,0.5: the grid sweeps itself" in done.stderr
    assert "runs:" not in done.stdout
