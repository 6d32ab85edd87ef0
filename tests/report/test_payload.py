"""The data the report page is built from: real traces of the bundled pair, and the committed grid runs."""

import json
import re
import shlex
from pathlib import Path

import pytest

from adafuse.errors import DataError
from conf.compose import compose_run
from eval.collect import find_runs
from eval.report import ReportRun, build_payload, finite, open_run, pair_counts, render, trace_view
from eval.report.__main__ import main as cli
from eval.results import read_predictions
from tests.support.paths import ROOT

GRID = ROOT / "results" / "grid"


def records(run_dir: Path) -> list[dict]:
    return list(read_predictions(run_dir / "predictions.jsonl").values())


def embedded(html: str) -> dict:
    """The payload as the page reads it: the JSON inside its data script."""
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)[1]
    return json.loads(data)


@pytest.mark.slow
def test_adafuse_rounds_are_the_traces(traced):
    for record in records(traced["adafuse"]):
        trace, view = record["trace"], trace_view("adafuse", record)
        assert view["kind"] == "adafuse"
        assert len(view["rounds"]) == len(trace["rounds"]) == record["stats"]["rounds"]
        for shown, rnd in zip(view["rounds"], trace["rounds"]):
            assert shown["winner"] == rnd["winner"]
            assert [c["text"] for c in shown["pool"]] == [c["text"] for c in rnd["candidates"]]
            assert [c["nll"] for c in shown["pool"]] == [[s["nll"] for s in c["scores"]] for c in rnd["candidates"]]
            assert [c["fused"] for c in shown["pool"]] == [c["fused"] for c in rnd["candidates"]]
            assert [m["margins"] for m in shown["models"]] == [m["margins"] for m in rnd["models"]]
            assert [m["committed"] for m in shown["models"]] == [m["committed"] for m in rnd["models"]]
            # Each model's branches are the candidates it proposed.
            for k, model in enumerate(shown["models"]):
                assert model["proposed"] == [j for j, c in enumerate(rnd["candidates"]) if k in c["proposers"]]
            winner = rnd["candidates"][rnd["winner"]]
            assert shown["appended"] + shown["cut"] == winner["text"]
        # The rounds' appended text is the prediction; the stop is named on the last round only.
        assert "".join(r["appended"] for r in view["rounds"]) == record["prediction"]
        assert [r["stop"] for r in view["rounds"]] == [None] * (len(trace["rounds"]) - 1) + [
            record["stats"]["stop_reason"]
        ]


@pytest.mark.slow
def test_a_stop_inside_the_winner_is_shown_cut(traced):
    """NQ's stop is a blank line, which the winning candidate usually runs into ('... \\n\\nQuestion:')."""
    cuts = [r["cut"] for rec in records(traced["adafuse"]) for r in trace_view("adafuse", rec)["rounds"] if r["cut"]]
    assert cuts, "no traced example ran past its stop string"
    assert all(cut.startswith("\n\n") for cut in cuts)


@pytest.mark.slow
def test_the_page_holds_the_traces_winners(traced):
    payload = embedded(render(build_payload([traced["adafuse"]])))
    by_id = {r["id"]: r for r in records(traced["adafuse"])}
    assert [ex["id"] for ex in payload["examples"]] == open_run(traced["adafuse"]).ids  # the task's order
    for example in payload["examples"]:
        trace = by_id[example["id"]]["trace"]
        rounds = example["runs"][0]["trace"]["rounds"]
        shown = [r["pool"][r["winner"]]["text"] for r in rounds]
        assert shown == [rnd["candidates"][rnd["winner"]]["text"] for rnd in trace["rounds"]]
        assert payload["prompt_prefix"] + example["prompt"] == by_id[example["id"]]["prompt"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["unite", "sweetspan", "llm_blender", "single"])
def test_baseline_traces(traced, method):
    for record in records(traced[method]):
        view = trace_view(method, record)
        steps = record["trace"]["steps"]
        assert view["kind"] == method
        if method == "sweetspan":
            assert [r["winner"] for r in view["rounds"]] == [s["winner"] for s in steps]
            assert [[c["fused"] for c in r["pool"]] for r in view["rounds"]] == [
                [c["score"] for c in s["candidates"]] for s in steps
            ]
        elif method == "llm_blender":
            ranking = view["ranking"]
            assert ranking["answers"][ranking["chosen"]] == record["prediction"]
        else:
            assert len(view["steps"]) == len(steps) > 0
        if method == "single":  # greedy: the steps' text is the output (before the stop cut it)
            assert "".join(s["text"] for s in view["steps"]).startswith(record["prediction"])
        if method == "unite":
            assert "".join(s["union"][s["winner"]] or "" for s in view["steps"]).startswith(record["prediction"])


@pytest.mark.slow
def test_pair_counts_against_the_predictions(traced):
    a, b = ReportRun(open_run(traced["adafuse"])), ReportRun(open_run(traced["single"]))
    ours, theirs = (
        read_predictions(a.run.path / "predictions.jsonl"),
        read_predictions(b.run.path / "predictions.jsonl"),
    )
    em = {i: (ours[i]["scores"]["em"], theirs[i]["scores"]["em"]) for i in ours}
    assert a.binary and b.binary and a.primary == "em"
    assert pair_counts(a, b) == {
        "shared": len(em),
        "a_better": sum(x == 1 and y == 0 for x, y in em.values()),
        "b_better": sum(x == 0 and y == 1 for x, y in em.values()),
        "tie": sum(x == y for x, y in em.values()),
        "differ": sum(ours[i]["prediction"] != theirs[i]["prediction"] for i in ours),
    }


def test_trace_command_reruns_those_examples_with_a_trace():
    run = ReportRun(open_run(GRID / "nq" / "adafuse" / "tiny" / "method.tau=0.3"))
    assert not run.has_trace
    for ids, limit in ((None, run.run.metrics["n"]), (["nq-0"], 1), (["nq-3", "nq-41"], 42)):
        words = shlex.split(run.trace_command(ids))
        assert words[:2] == ["python", "run.py"]
        cfg = compose_run(*words[2:])  # the overrides compose as run.py composes them
        assert cfg.trace is True and cfg.task.limit == limit
        assert (cfg.task.name, cfg.method.name, cfg.method.tau, cfg.model_pair.name) == ("nq", "adafuse", 0.3, "tiny")
        assert cfg.results_dir == "results/grid"


def test_every_committed_run_makes_a_page():
    runs = find_runs(GRID)
    assert len(runs) > 40
    for run in runs:
        html = render(build_payload([run.path], resamples=100))
        payload = embedded(html)
        assert [ex["id"] for ex in payload["examples"]] == run.ids
        summary = payload["runs"][0]
        assert summary["metrics"].keys() == run.metrics["metrics"].keys()
        assert all(m["se"] > 0 or m["value"] in (0, 100) for m in summary["metrics"].values())
        # None of them has a trace: every example says how to get one.
        assert summary["trace_command"] and "trace=true" in summary["trace_command"]
        assert all(ex["runs"][0]["trace"] is None and ex["runs"][0]["trace_command"] for ex in payload["examples"])


def test_runs_side_by_side_align_by_id():
    adafuse, gemma = GRID / "nq/adafuse/tiny/default", GRID / "nq/single/tiny/method.member=1"
    payload = build_payload([adafuse, gemma], resamples=100)
    theirs = read_predictions(gemma / "predictions.jsonl")
    for example in payload["examples"]:
        assert example["runs"][1]["prediction"] == theirs[example["id"]]["prediction"]


def test_bad_input_is_named(tmp_path):
    with pytest.raises(DataError, match="no metrics.json"):
        build_payload([tmp_path])
    with pytest.raises(DataError, match="one task"):
        build_payload([GRID / "nq/adafuse/tiny/default", GRID / "squad/adafuse/tiny/default"])
    with pytest.raises(DataError, match="at least one"):
        build_payload([])


def test_non_finite_scores_survive_as_names():
    assert finite({"scores": [1.5, float("inf")], "x": [float("nan")]}) == {"scores": [1.5, "inf"], "x": ["nan"]}


def test_command_line(tmp_path, capsys):
    out = tmp_path / "nq.html"
    assert (
        cli([str(GRID / "nq/adafuse/tiny/default"), str(GRID / "nq/single/tiny/method.member=1"), "-o", str(out)]) == 0
    )
    assert len(embedded(out.read_text())["runs"]) == 2
    assert cli([str(tmp_path), "-o", str(out)]) == 2
    assert "not a finished run directory" in capsys.readouterr().err
