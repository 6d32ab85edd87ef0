"""tools/gpu_check.py's StepRecord: the one deadline of a GPU check's steps, and its JSON written as each ends."""

import json

from tools.gpu_check import StepRecord


def test_a_step_past_the_deadline_is_skipped_and_says_so(tmp_path):
    late = StepRecord(tmp_path / "late.json", 0.0, {})
    assert late.step("decode", lambda left: {"ran": True})["skipped"] == "out of time"
    assert "ran" not in json.loads((tmp_path / "late.json").read_text())["decode"]


def test_each_step_is_written_as_it_ends_a_failing_one_with_its_error(tmp_path):
    out = tmp_path / "check.json"
    record = StepRecord(out, 60.0, {"dry_run": True})
    record.step("fails", lambda left: {"quotient": 1 / 0})
    assert json.loads(out.read_text())["fails"]["error"] == "ZeroDivisionError: division by zero"
    record.step("runs", lambda left: {"left": left})
    written = json.loads(out.read_text())
    assert written["dry_run"] is True and 0 < written["runs"]["left"] <= 60 and "error" in written["fails"]
