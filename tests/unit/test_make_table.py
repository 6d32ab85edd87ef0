"""scripts/make_table.py on small results directories written here in the runner's own format
(predictions scored by the task, metrics.json from eval.runner.summary): the numbers, not the looks."""

import csv
import json
import math
from pathlib import Path

import pytest

from eval.metrics import spbleu_available
from tests.support.run_in_process import run_script
from tests.support.runs import pattern, write_run


def make_table(results: Path, *args: str) -> dict[tuple[str, str], dict]:
    """Run the script (in this process); its CSV as {(row, task): line}."""
    done = run_script("make_table", str(results), *args)
    assert done.returncode == 0, done.stderr
    stem = "table1_paper" if "paper" in args else "table1"
    with open(results / f"{stem}.csv") as f:
        return {(line["row"], line["task"]): line for line in csv.DictReader(f)}


def test_a_cells_standard_error_is_the_standard_error_of_a_proportion(tmp_path):
    correct = [k % 10 < 3 for k in range(400)]  # 30% right
    write_run(tmp_path, "nq", "adafuse", correct)
    cell = make_table(tmp_path)[("adafuse", "nq")]
    assert float(cell["value"]) == pytest.approx(30.0)
    assert float(cell["se"]) == pytest.approx(100 * math.sqrt(0.3 * 0.7 / 400), rel=0.1)
    assert (cell["n"], cell["variant"]) == ("400", "canonical")


def test_the_paired_interval_excludes_zero_when_adafuse_wins_on_the_same_examples(tmp_path):
    baseline = [k % 5 < 2 for k in range(100)]  # 40 right
    ours = [b or k in (2, 7, 12, 17, 22, 27) for k, b in enumerate(baseline)]  # the same 40, and 6 more
    write_run(tmp_path, "nq", "adafuse", ours)
    write_run(tmp_path, "nq", "single", baseline)
    write_run(tmp_path, "nq", "single", pattern(100, 4), "method.member=1")  # 25 right
    table = make_table(tmp_path)
    gain = table[("AdaFuse gain vs best single model", "nq")]
    assert float(gain["value"]) == pytest.approx(6.0) and gain["n"] == "100"
    # Unpaired, two 100-example proportions 6 points apart overlap; paired, the 6 wins stand out.
    assert 0 < float(gain["ci_low"]) < 6 < float(gain["ci_high"])
    assert float(gain["relative"]) == pytest.approx(15.0)  # 6 / 40, as the paper's gain row
    assert table[("smollm2_135m", "nq")]["value"] == "40.0" and table[("gemma3_270m", "nq")]["value"] == "25.0"


def test_a_relative_gain_over_a_best_that_some_resamples_score_0_has_no_interval(tmp_path):
    write_run(tmp_path, "nq", "adafuse", pattern(20, 10))  # 2 right of 20
    write_run(tmp_path, "nq", "single", [k == 0 for k in range(20)])  # 1 right: 0 in about a third of resamples
    write_run(tmp_path, "nq", "single", [False] * 20, "method.member=1")
    gain = make_table(tmp_path)[("AdaFuse gain vs best single model", "nq")]
    assert float(gain["relative"]) == pytest.approx(100.0)
    assert gain["relative_ci_low"] == gain["relative_ci_high"] == ""
    assert "+100.0% [no interval: best is 0 in some resamples]" in (tmp_path / "table1.md").read_text()


def test_a_corpus_metric_is_resampled_whole_and_keeps_its_value(tmp_path):
    run = write_run(tmp_path, "flores_de_en", "adafuse", pattern(40, 2))  # half the references, half "no idea"
    cell = make_table(tmp_path, "--resamples", "200")[("adafuse", "flores_de_en")]
    assert cell["metric"] == "bleu"
    assert float(cell["value"]) == json.loads((run / "metrics.json").read_text())["metrics"]["bleu"]
    assert 2 < float(cell["se"]) < 20


def test_rows_columns_average_and_slices_are_stated(tmp_path):
    write_run(tmp_path, "nq", "adafuse", pattern(20, 2))
    write_run(tmp_path, "nq", "adafuse", pattern(20, 4), "method.tau=0.5")
    write_run(tmp_path, "gsm8k", "adafuse", pattern(10, 2))
    write_run(tmp_path, "gsm8k", "adafuse", pattern(12, 3), "method.tau=0.5")  # another slice size
    cells = make_table(tmp_path)
    table = (tmp_path / "table1.md").read_text()
    assert "NQ (n=20, canonical)" in table  # one slice for the whole column: said once
    assert "(n=12, canonical)" in table and "(n=10, canonical)" in table  # two slices: said in each cell
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table.splitlines()[4:]}
    assert rows["adafuse [method.tau=0.5]"][1].startswith("33.3 ± ")
    se = math.hypot(float(cells[("adafuse", "nq")]["se"]), float(cells[("adafuse", "gsm8k")]["se"])) / 2
    assert rows["adafuse"][2] == f"50.0 ± {se:.1f}"  # the average of independent tasks
    latex = (tmp_path / "table1.tex").read_text()
    assert r"50.0 $\pm$" in latex and "±" not in latex


def test_paper_metrics_and_the_papers_own_rows(tmp_path):
    write_run(tmp_path, "nq", "adafuse", pattern(10, 2))
    table = make_table(tmp_path, "--metric", "paper", "--paper")
    assert table[("adafuse", "nq")]["metric"] == "paper_em"
    markdown = (tmp_path / "table1_paper.md").read_text()
    assert "| paper: UniTE " in markdown and "38.95" in markdown and "paper_* replicas" in markdown


def test_two_runs_for_one_cell_are_refused(tmp_path):
    write_run(tmp_path / "a", "nq", "adafuse", pattern(10, 2))
    write_run(tmp_path / "b", "nq", "adafuse", pattern(20, 2))
    done = run_script("make_table", str(tmp_path))
    assert done.returncode != 0 and "two runs for row 'adafuse', task nq" in done.stderr


def test_settings_that_every_run_shares_are_stated_once(tmp_path):
    write_run(tmp_path, "nq", "adafuse", pattern(10, 2), "task.max_new_tokens=8")
    write_run(tmp_path, "nq", "single", pattern(10, 5), "task.max_new_tokens=8")
    table = make_table(tmp_path)
    assert ("adafuse", "nq") in table and ("smollm2_135m", "nq") in table
    assert float(table[("AdaFuse gain vs best single model", "nq")]["value"]) == pytest.approx(30.0)
    assert "Every run: task.max_new_tokens=8." in (tmp_path / "table1.md").read_text()


def test_results_of_several_model_pairs_need_a_choice(tmp_path):
    write_run(tmp_path, "nq", "single", pattern(4, 2))
    write_run(tmp_path, "nq", "adafuse", pattern(4, 1), "model_pair=small")
    done = run_script("make_table", str(tmp_path))
    assert done.returncode != 0 and "several model pairs (small, tiny): choose one with --pair" in done.stderr
    assert {row for row, _ in make_table(tmp_path, "--pair", "small")} == {"adafuse"}
    assert {row for row, _ in make_table(tmp_path, "--pair", "tiny")} == {"smollm2_135m"}


def test_protocol_runs_sit_beside_the_papers_rows_and_every_row_names_its_ranker(tmp_path):
    write_run(tmp_path, "nq", "adafuse", pattern(20, 4))  # 5 right
    write_run(tmp_path, "nq", "llm_blender", pattern(20, 5))  # 4 right
    write_run(tmp_path, "nq", "deepen", pattern(20, 10), "method.main=sentencepiece")
    write_run(tmp_path, "nq", "adafuse_code", pattern(20, 2), "protocol=paper")  # 10 right: no one's best baseline
    table = make_table(tmp_path, "--paper")
    assert float(table[("AdaFuse gain vs best baseline", "nq")]["value"]) == pytest.approx(5.0)  # vs llm_blender
    protocol = table[("adafuse_code [protocol=paper]", "nq")]
    assert (protocol["kind"], protocol["metric"], protocol["variant"]) == ("protocol", "paper_em", "paper")
    assert table[("adafuse", "nq")]["metric"] == "em"
    assert ("llm_blender [method.ranker=nll]", "nq") in table and ("deepen [method.main=sentencepiece]", "nq") in table
    markdown = (tmp_path / "table1.md").read_text()
    rows = [line.split("|")[1].strip() for line in markdown.splitlines()[4:] if line.startswith("|")]
    assert rows.index("adafuse_code [protocol=paper]") + 1 == rows.index("paper: Mistral-7B-Instruct-v0.3")
    assert "protocol=paper runs" in markdown


def test_each_bleu_records_its_tokenizer_and_a_table_refuses_to_mix_tokenizers(tmp_path):
    ours = write_run(tmp_path, "flores_de_en", "adafuse", pattern(8, 2))
    theirs = write_run(tmp_path, "flores_de_en", "single", pattern(8, 4))
    metrics = json.loads((ours / "metrics.json").read_text())
    assert metrics["bleu_tokenizers"] == {"bleu": "13a", "paper_bleu": "flores101" if spbleu_available() else "13a"}
    assert set(metrics["metrics_skipped"]) == (set() if spbleu_available() else {"spbleu"})
    make_table(tmp_path)
    assert "BLEU tokenizers (sacrebleu): bleu 13a." in (tmp_path / "table1.md").read_text()
    # as if the other run had been scored where the flores101 SentencePiece model was at hand
    recorded = json.loads((theirs / "metrics.json").read_text())
    recorded["bleu_tokenizers"]["bleu"] = "flores101"
    (theirs / "metrics.json").write_text(json.dumps(recorded))
    done = run_script("make_table", str(tmp_path))
    assert done.returncode != 0
    refused = "bleu was tokenized differently in these runs, so one table cannot compare them"
    assert f"{refused}: 13a: {ours}; flores101: {theirs}." in done.stderr


def test_sources_name_each_runs_data_and_models_by_what_pins_them(tmp_path, shared_data):
    import hashlib

    write_run(tmp_path, "nq", "adafuse", pattern(10, 2))
    done = run_script("make_table", str(tmp_path), "--sources")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "table1_sources.md").read_text()
    dev = hashlib.sha256((shared_data / "nq_open/NQ-open.dev.jsonl").read_bytes()).hexdigest()
    (line,) = [line for line in text.splitlines() if line.startswith("| adafuse ")]
    assert f"nq_open/NQ-open.dev.jsonl (sha256 {dev[:12]})" in line
    assert "smollm2_135m (sha256 b179c9523d0e)" in line and "gemma3_270m (sha256 a5fd3b62230a)" in line


def test_a_task_outside_the_six_has_a_column_of_its_own_and_stays_out_of_the_average(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the run id names the file as given: task.path=mine.jsonl
    lines = [{"id": f"q{i}", "prompt": f"Q{i}?", "references": [f"a{i}"]} for i in range(4)]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    write_run(tmp_path / "results", "nq", "adafuse", pattern(10, 2))
    write_run(tmp_path / "results", "custom", "adafuse", pattern(4, 4), "task.path=mine.jsonl")
    cells = make_table(tmp_path / "results")
    assert float(cells[("adafuse", "custom")]["value"]) == 25.0  # one row: the file is the column's
    markdown = (tmp_path / "results" / "table1.md").read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("|  "))
    assert [c.strip() for c in header.split("|")[2:-1]] == [
        "NQ (n=10, canonical)",
        "custom [task.path=mine.jsonl] (n=4, canonical)",
        "Avg",
    ]
    (row,) = [line for line in markdown.splitlines() if line.startswith("| adafuse ")]
    assert [c.strip() for c in row.split("|")[2:-1]] == ["50.0 ± 15.8", "25.0 ± 21.4", "50.0 ± 15.8"]  # Avg: NQ
    assert "custom, not among them, is not in it" in markdown


def test_a_single_model_under_the_papers_protocol_sits_with_the_protocol_rows_and_enters_no_gain(tmp_path):
    write_run(tmp_path, "nq", "adafuse", pattern(10, 2))  # 5 right
    write_run(tmp_path, "nq", "single", pattern(10, 5))  # 2 right
    write_run(tmp_path, "nq", "single", pattern(10, 1), "protocol=paper")  # all right, by the paper's scorer
    cells = make_table(tmp_path)
    assert float(cells[("AdaFuse gain vs best single model", "nq")]["value"]) == pytest.approx(30.0)
    names = [line.split("|")[1].strip() for line in (tmp_path / "table1.md").read_text().splitlines()[4:]]
    assert names[-1] == "smollm2_135m [protocol=paper]" and names.index("smollm2_135m") == 0
