"""scripts/make_figures.py on a small results directory in the runner's format: each figure's CSV
holds the runs it should, and a figure without runs is skipped, not drawn empty."""

import json

import pandas as pd

from tests.support.run_in_process import run_script
from tests.support.runs import pattern, write_run


def make_figures(results, *args: str):
    done = run_script("make_figures", str(results), *args)
    assert done.returncode == 0, done.stderr
    return done


def test_sweeps_become_figures_and_absent_ones_are_skipped(tmp_path):
    write_run(tmp_path, "nq", "adafuse", pattern(10, 2))  # the default run: tau 0.7, B 3, adaptive
    write_run(tmp_path, "nq", "adafuse", pattern(10, 5), "method.tau=0.3")
    write_run(tmp_path, "nq", "adafuse", pattern(10, 1), "method.tau=0.9")
    write_run(tmp_path, "nq", "adafuse", pattern(10, 3), "method.tau=0.3", "task.max_new_tokens=8")  # not a tau sweep
    write_run(tmp_path, "nq", "adafuse", pattern(10, 3), "method.fixed_words=2")
    write_run(tmp_path, "gsm8k", "adafuse", pattern(10, 2))
    write_run(tmp_path, "nq", "single", pattern(10, 4))
    done = make_figures(tmp_path)
    figures = tmp_path / "figures"

    tau = pd.read_csv(figures / "tau.csv")
    nq = tau[tau["task"] == "nq"]
    assert list(nq["tau"]) == [0.3, 0.7, 0.9] and list(nq["value"]) == [20.0, 50.0, 100.0]
    assert (nq["se"] > 0).sum() == 2  # 100% right has no spread
    fixed = pd.read_csv(figures / "fixed_words.csv")
    assert sorted(fixed["commitment"]) == ["adaptive", "fixed 2"]
    words = pd.read_csv(figures / "words_per_round.csv")  # every test run commits 1 word, then 2
    assert set(words["task"]) == {"nq", "gsm8k"} and list(words["fraction"]) == [0.5, 0.5, 0.5, 0.5]
    runtime = pd.read_csv(figures / "runtime.csv")
    assert sorted(runtime["method"]) == ["adafuse", "adafuse", "smollm2_135m"]
    for name in ("tau", "fixed_words", "words_per_round", "runtime"):
        assert (figures / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("branches", "max_words"):
        assert not (figures / f"{name}.png").exists() and f"{name}: skipped" in done.stderr


def test_a_sweeps_points_are_scored_on_the_examples_all_of_them_decoded(tmp_path):
    # The default run covers 20 examples (Table 1's slice), the sweep points the first 10.
    write_run(tmp_path, "nq", "adafuse", pattern(10, 1) + [False] * 10)  # all 10 shared ones right
    write_run(tmp_path, "nq", "adafuse", pattern(10, 2), "method.branches=1")
    write_run(tmp_path, "nq", "adafuse", pattern(10, 5), "method.fixed_words=1")
    make_figures(tmp_path)
    branches = pd.read_csv(tmp_path / "figures" / "branches.csv")
    assert list(branches["branches"]) == [1, 3] and list(branches["value"]) == [50.0, 100.0]
    assert list(branches["n"]) == [10, 10]  # not the default run's 50.0 over its own 20
    fixed = pd.read_csv(tmp_path / "figures" / "fixed_words.csv")
    assert list(fixed["value"]) == [100.0, 20.0] and list(fixed["n"]) == [10, 10]


def test_the_runtime_figure_can_be_limited_to_some_tasks_and_names_each_variant(tmp_path):
    write_run(tmp_path, "nq", "adafuse", pattern(4, 2))
    write_run(tmp_path, "gsm8k", "adafuse", pattern(4, 2))
    write_run(tmp_path, "nq", "llm_blender", pattern(4, 2))
    write_run(tmp_path, "nq", "deepen", pattern(4, 2))
    make_figures(tmp_path, "--runtime-tasks", "nq")
    runtime = pd.read_csv(tmp_path / "figures" / "runtime.csv")
    assert list(runtime["task"]) == ["nq"] * 3
    assert sorted(runtime["method"]) == ["adafuse", "deepen (main 0)", "llm_blender (ranker nll)"]


def test_diversity_has_its_figure_and_every_task_is_drawn_and_runtime_says_its_batch_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the run id names the file as given: task.path=mine.jsonl
    lines = [{"id": f"q{i}", "prompt": f"Q{i}?", "references": [f"a{i}"]} for i in range(4)]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    results = tmp_path / "results"
    write_run(results, "nq", "adafuse", pattern(10, 2))
    write_run(results, "nq", "adafuse", pattern(10, 5), "method.diversity=false")
    write_run(results, "custom", "adafuse", pattern(4, 2), "task.path=mine.jsonl")
    write_run(results, "custom", "adafuse", pattern(4, 1), "task.path=mine.jsonl", "method.tau=0.3")
    done = make_figures(results)
    figures = results / "figures"
    diversity = pd.read_csv(figures / "diversity.csv")
    assert list(diversity["branches from"]) == ["distinct first tokens", "word-level beam search"]
    assert list(diversity["value"]) == [50.0, 20.0] and (figures / "diversity.png").is_file()
    words = pd.read_csv(figures / "words_per_round.csv")
    assert set(words["task"]) == {"nq", "custom"}  # a task outside the six is drawn, after them
    runtime = pd.read_csv(figures / "runtime.csv")
    assert set(runtime["batch_size"]) == {8} and "runtime: wrote" in done.stderr
