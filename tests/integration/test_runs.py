"""End to end on the bundled pair: all six benchmarks with both methods, metric values recomputed
independently from the written predictions, resume after SIGKILL, the offline W&B record."""

import ast
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from omegaconf import OmegaConf

from adafuse.errors import ConfigError, ContextLengthError
from conf.compose import compose_run
from eval.runner import main
from eval.tasks import Task
from oracles import scorers
from tests.support.paths import ROOT, SHARED_DATA
from tests.support.runs import decoded, read_predictions, run_task

pytestmark = pytest.mark.slow

TASKS = ["nq", "triviaqa", "squad", "gsm8k", "flores_en_de", "flores_de_en"]


def first_references(task: str, n: int) -> list[list[str]]:
    """The gold answers of a benchmark's first n examples, read straight from its file: canonical order."""
    if task == "nq":
        lines = (SHARED_DATA / "nq_open/NQ-open.dev.jsonl").read_text().splitlines()[:n]
        return [json.loads(line)["answer"] for line in lines]
    if task == "triviaqa":
        with gzip.open(SHARED_DATA / "triviaqa/topics.dpr.trivia.test.txt.gz", "rt") as f:
            return [ast.literal_eval(next(f).split("\t")[1]) for _ in range(n)]
    if task == "squad":
        with gzip.open(SHARED_DATA / "squad_v1.1/dev-v1.1.json.gz", "rt") as f:
            article = json.load(f)["data"][0]
        questions = [qa for paragraph in article["paragraphs"] for qa in paragraph["qas"]][:n]
        return [[a["text"] for a in qa["answers"]] for qa in questions]
    if task == "gsm8k":
        lines = (SHARED_DATA / "gsm8k/test.jsonl").read_text().splitlines()[:n]
        return [[json.loads(line)["answer"].split("####")[1].strip().replace(",", "")] for line in lines]
    target = {"flores_en_de": "deu_Latn", "flores_de_en": "eng_Latn"}[task]
    lines = (SHARED_DATA / f"flores200/{target}.devtest").read_text().splitlines()[:n]
    return [[line] for line in lines]


def scored_as_written(out: Path, metrics: dict) -> dict:
    """Every metric of metrics.json recomputed from the raw predictions that the run wrote, through the
    hand-written extractors and scorers of tests/integration/scorers.py (not eval/); the recomputed
    corpus values (None: a lenient verdict that only word2number decides)."""
    task = yaml.safe_load((out / "config.yaml").read_text())["task"]
    records = read_predictions(out)
    corpus, per = scorers.recompute(task["metrics"], task["extract"], records)
    assert [r["answer"] for r in records] == [scorers.extracted(task["extract"], r["prediction"]) for r in records]
    got = metrics["metrics"]
    assert set(corpus) <= set(got) and set(got) - set(corpus) <= {"spbleu"}
    for name, value in corpus.items():
        if value is None:  # the decided examples are compared below; the corpus is the mean of the written
            assert got[name] == pytest.approx(100 * sum(r["scores"][name] for r in records) / len(records))
        else:
            assert got[name] == pytest.approx(value, abs=1e-6), name
    for name, scores in per.items():
        for record, score in zip(records, scores):
            if score is not None:
                assert record["scores"][name] == pytest.approx(score, abs=1e-6), (name, record["prediction"])
    return corpus


def right_answer(chain: list[str], references: list[str]) -> str:
    """A generation that says the first reference as the task's extractor reads it."""
    return f" The answer is {references[0]}." if chain == ["answer_number"] else f" {references[0]}"


def assert_a_right_answer_gets_full_marks(out: Path) -> None:
    """The run's own scoring (its saved config, through eval.tasks.Task) gives every metric full marks when
    each prediction is a reference: a scorer that returns 0 fails here even where the models got none right."""
    cfg = OmegaConf.load(out / "config.yaml")
    task = Task(cfg.task, cfg.data)
    records = []
    for r in read_predictions(out):
        prediction = right_answer(list(cfg.task.extract), r["references"])
        answer, scores = task.score(SimpleNamespace(references=r["references"]), prediction)
        assert scores == {k: pytest.approx(100 / task.metrics[k].scale) for k in scores}, (prediction, scores)
        records.append({"prediction": prediction, "answer": answer, "references": r["references"]})
    corpus = task.corpus_scores(records)
    assert corpus and corpus == {k: pytest.approx(100) for k in corpus}, corpus


@pytest.mark.parametrize("method", ["adafuse", "single"])
@pytest.mark.parametrize("task", TASKS)
def test_each_benchmark_runs_and_scores_what_it_wrote(task, method, tmp_path):
    out = tmp_path / "run"
    n = 2  # decoded together (batch_size 8): the finish order is not the canonical order
    metrics = run_task(task, method, out, f"task.limit={n}")
    records = read_predictions(out)
    # the first n examples of the canonical order; lines are written as examples finish (batched)
    assert sorted(map(json.dumps, [r["references"] for r in records])) == sorted(
        map(json.dumps, first_references(task, n))
    )
    assert len({r["id"] for r in records}) == n
    assert metrics["n"] == n and metrics["task"] == task and metrics["method"]["name"] == method
    assert metrics["models"] == (["smollm2_135m", "gemma3_270m"] if method == "adafuse" else ["smollm2_135m"])
    assert json.loads((out / "metrics.json").read_text()) == metrics
    assert yaml.safe_load((out / "config.yaml").read_text())["task"]["name"] == task
    for r in records:
        assert set(r) >= {"id", "prompt", "prediction", "answer", "references", "scores", "stats"}
        assert r["stats"]["stop_reason"] in ("eos", "stop", "length")
        assert not any(s in r["prediction"] for s in ("\n",) if task != "gsm8k")  # cut at the stop string
    scored_as_written(out, metrics)
    assert_a_right_answer_gets_full_marks(out)


# Prompts with known right answers. With 16 new tokens SmolLM2-135M (method=single) says " 5", " 8", the
# sentence to copy, and " 6, 7, 8, 9, 10," (checked when these tests were written); the pair's ensemble
# says " 2 + 3 = 5" to the first. Every metric of every benchmark's scoring is above 0 on them.
ANSWERABLE = [
    ("add", "Question: What is 2 + 3?\nAnswer:", ["5"]),
    ("double", "2 + 2 = 4\n3 + 3 = 6\n4 + 4 =", ["8"]),
    (
        "copy",
        "Copy each sentence exactly.\nSentence: The cat sat on the mat.\nCopy: The cat sat on the mat.\n"
        "Sentence: The dog ran in the park today.\nCopy:",
        ["The dog ran in the park today."],
    ),
    ("count", "1, 2, 3, 4, 5,", ["6"]),
]


def write_prompts(path: Path, rows: list[tuple[str, str, list[str]]]) -> None:
    path.write_text("".join(json.dumps({"id": i, "prompt": p, "references": r}) + "\n" for i, p, r in rows))


@pytest.mark.parametrize("scoring", ["nq", "triviaqa", "squad", "gsm8k", "flores_en_de"])
def test_a_benchmarks_metrics_are_above_0_and_recomputed_on_prompts_with_known_answers(scoring, tmp_path):
    """The benchmark's extractor and metrics (conf/task/<scoring>.yaml) on a custom task that the model answers
    right: every metric is above 0, so a scorer that returns 0 (or an extractor that returns "") fails here."""
    spec = yaml.safe_load((ROOT / "conf" / "task" / f"{scoring}.yaml").read_text())
    prompts = tmp_path / "answerable.jsonl"
    numbers = spec["extract"] == ["answer_number"]  # GSM8K's references are numbers
    write_prompts(prompts, [row for row in ANSWERABLE if not numbers or row[2][0].isdigit()])
    scoring_overrides = [
        "~task.metrics.em",
        "~task.metrics.f1",
        *(f"+task.metrics.{reported}={key}" for reported, key in spec["metrics"].items()),
        f"task.extract=[{','.join(spec['extract'])}]",
    ]
    out = tmp_path / "run"
    custom = ["task=custom", f"task.path={prompts}", r'task.stop=["\n"]', "task.max_new_tokens=16"]
    metrics = run_task("custom", "single", out, *custom, *scoring_overrides)
    expected = scored_as_written(out, metrics)
    assert set(expected) == set(spec["metrics"]) - {"spbleu"}
    assert all(value > 0 for value in expected.values()), expected
    assert_a_right_answer_gets_full_marks(out)


def test_a_run_killed_with_sigkill_resumes_without_losing_or_repeating_examples(tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable,
        str(ROOT / "run.py"),
        "task=nq",
        "task.limit=8",
        "method=single",  # what resumes is the runner's, the same for every method; one model decodes fastest
        "batch_size=1",  # examples finish one by one, so the kill lands part-way
        f"data.dir={SHARED_DATA}",
        "wandb.mode=disabled",
        "progress=false",
        f"hydra.run.dir={out}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    predictions = out / "predictions.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not predictions.exists() or predictions.read_text().count("\n") < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = predictions.read_text().splitlines()
    assert 3 <= len(before) < 8, "the run should have been killed part-way"
    with open(predictions, "a") as f:  # as if the kill had landed in the middle of a write
        f.write('{"id": "nq-9", "predic')
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    after = predictions.read_text().splitlines()
    ids = [json.loads(line)["id"] for line in after]
    assert sorted(ids) == sorted(f"nq-{i}" for i in range(8)) and len(ids) == len(set(ids))
    assert after[: len(before)] == before  # finished examples were kept as written
    resumed = json.loads((out / "metrics.json").read_text())
    whole = main(compose_run(*command[2:-1]), tmp_path / "whole")  # the same run, never interrupted
    by_id = {r["id"]: decoded(r) for r in read_predictions(tmp_path / "whole")}
    assert [decoded(json.loads(line)) for line in after] == [by_id[i] for i in ids]
    assert resumed["metrics"] == whole["metrics"] and resumed["n"] == 8


def test_a_batched_run_writes_the_same_predictions_and_times_the_run_by_its_wall_clock(tmp_path):
    alone = run_task("nq", "single", tmp_path / "alone", "batch_size=1")
    started = time.perf_counter()
    batched = run_task("nq", "single", tmp_path / "batched", "batch_size=3")
    wall = time.perf_counter() - started
    records = read_predictions(tmp_path / "batched")
    by_id = {r["id"]: decoded(r) for r in read_predictions(tmp_path / "alone")}
    assert sorted(r["id"] for r in records) == sorted(by_id)  # written as they finish: in any order
    assert all(decoded(r) == by_id[r["id"]] for r in records)
    assert batched["metrics"] == alone["metrics"]
    # Examples in flight together overlap: their own seconds add up to more than the run took, and
    # the run's time is the wall time between finishes.
    run_seconds = sum(r["stats"]["run_seconds"] for r in records)
    assert batched["throughput"]["seconds"] == pytest.approx(run_seconds)
    assert run_seconds < min(wall, sum(r["stats"]["seconds"] for r in records))


def test_resuming_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "run"
    run_task("nq", "single", out, "task.limit=2")
    with pytest.raises(ConfigError, match="method"):
        run_task("nq", "single", out, "task.limit=2", "method.member=1")
    first = (out / "predictions.jsonl").read_text()
    again = run_task("nq", "single", out, "task.limit=3")  # a longer slice grows the same run
    assert again["n"] == 3 and len(read_predictions(out)) == 3
    assert (out / "predictions.jsonl").read_text().startswith(first)  # only the new example was decoded
    smaller = run_task("nq", "single", out, "task.limit=1")  # a shorter one scores the first example only
    assert smaller["ids"] == ["nq-0"] and len(read_predictions(out)) == 3
    other = run_task("nq", "single", tmp_path / "other", "task.limit=2", "method.member=1")
    assert other["method"]["member"] == 1 and other["models"] == ["gemma3_270m"]


def wandb_records(path: Path):
    """Records of a W&B transaction log (.wandb): 32 KiB blocks of (crc32, length, type, data) chunks."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunk = path.read_bytes(), 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7 or data[pos + 6] == 0:  # block trailer or zero padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        chunk += data[pos + 7 : pos + 7 + length]
        if data[pos + 6] in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            yield record
            chunk = b""
        pos += 7 + length


def test_offline_wandb_run_holds_config_running_and_final_metrics(tmp_path):
    prompts = tmp_path / "answerable.jsonl"
    write_prompts(prompts, ANSWERABLE[:3])  # SmolLM2 gets the first two right: the final EM is not 0
    out = tmp_path / "run"
    custom = ["task=custom", f"task.path={prompts}", r'task.stop=["\n"]', "task.max_new_tokens=16"]
    metrics = run_task("custom", "single", out, *custom, "wandb.mode=offline")
    expected = scored_as_written(out, metrics)
    assert expected["em"] > 0 and expected["f1"] > 0, "the check below needs scores above 0"
    (log,) = out.glob("wandb/offline-run-*/run-*.wandb")  # whole as the run returns (`Tracker.finish`)
    summary, history, config = {}, [], set()
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "summary":
            summary.update(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.summary.update}
            )
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key) for item in record.history.item})
        elif kind == "run":
            config.update(item.key for item in record.run.config.update)
    assert {"model_pair", "method", "task"} <= config
    assert {k for k in summary if k.startswith("final/")} == {"final/em", "final/f1"}
    for name, value in expected.items():
        assert summary[f"final/{name}"] == pytest.approx(value)
    assert sum("running/em" in keys for keys in history) == 3
    assert any(key.startswith("predictions") for keys in history for key in keys)  # the table


def running_values(log: Path, name: str) -> list[float]:
    values = []
    for record in wandb_records(log):
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                if (item.key or "/".join(item.nested_key)) == name:
                    values.append(json.loads(item.value_json))
    return values


def capitals(path: Path, *rows: tuple[str, str, str]) -> list[dict]:
    """A custom-task file of (id, country, reference) questions; its rows."""
    rows = [
        {"id": i, "prompt": f"Question: What is the capital of {country}?\nAnswer:", "references": [reference]}
        for i, country, reference in rows
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_a_resumed_wandb_run_averages_every_finished_example(tmp_path):
    prompts = tmp_path / "capitals.jsonl"
    capitals(prompts, ("fr", "France", "Paris"), ("xx", "France", "Lyon"))
    out = tmp_path / "run"
    custom = ["task=custom", f"task.path={prompts}", r'task.stop=["\n"]', "task.max_new_tokens=8", "wandb.mode=offline"]
    gemma = "method.member=1"  # Gemma-3 says Paris (SmolLM2 ends at once, with eos)
    run_task("custom", "single", out, *custom, gemma, "task.limit=1")
    metrics = run_task("custom", "single", out, *custom, gemma, "task.limit=2")  # resumes: decodes the second only
    first, second = (r["scores"]["f1"] for r in read_predictions(out))
    assert first > second == 0, "the check below needs two different scores"  # Paris, not Lyon
    logs = sorted(out.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 2
    # The resumed process logged one example; its running mean covers both, as the final metric does.
    assert running_values(logs[1], "running/f1") == [pytest.approx(metrics["metrics"]["f1"])]


def test_a_prompt_longer_than_a_models_context_is_refused_before_decoding(tmp_path):
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"id": "long", "prompt": "word " * 9000}) + "\n")
    with pytest.raises(ContextLengthError, match="smollm2_135m.*8192"):
        main(compose_run("task=custom", f"task.path={prompts}", "wandb.mode=disabled"), tmp_path / "run")
    assert not (tmp_path / "run" / "predictions.jsonl").exists()


def test_custom_prompts_with_references_are_decoded_and_scored(tmp_path):
    prompts = tmp_path / "mine.jsonl"
    rows = capitals(prompts, ("fr", "France", "Paris"), ("de", "Germany", "Berlin"))
    # The README's form, task.stop='["\n"]', reaches Hydra as a backslash and an n: it must stop at a newline.
    readme_form = "task.stop=" + '["' + "\\" + 'n"]'
    metrics = main(
        compose_run(
            "task=custom",
            f"task.path={prompts}",
            readme_form,
            "task.max_new_tokens=16",
            "method=single",  # the task's reading, stopping and scoring are the runner's, for every method
            "method.member=1",  # Gemma-3 answers both (SmolLM2 ends at once, with eos)
            "wandb.mode=disabled",
            "progress=false",
        ),
        tmp_path / "run",
    )
    records = read_predictions(tmp_path / "run")  # in finish order: both examples decode together
    assert {r["id"]: r["prompt"] for r in records} == {r["id"]: r["prompt"] for r in rows}
    assert all(r["stats"]["stop_reason"] == "stop" and "\n" not in r["prediction"] for r in records)
    assert metrics["metrics"]["em"] == pytest.approx(100 * sum(r["scores"]["em"] for r in records) / 2)


def test_gsm8k_answers_come_from_the_answer_line_of_the_raw_prediction(tmp_path):
    # With 64 tokens SmolLM2 ends the fourth problem with "The answer is 60 + 3 = 90." (checked when
    # this test was written): the answer line's number, 60, wins over the last number, 90.
    out = tmp_path / "run"
    run_task("gsm8k", "single", out, "task.limit=4", "task.max_new_tokens=64")
    said = [r for r in read_predictions(out) if "The answer is" in r["prediction"]]
    assert said, "no prediction reached 'The answer is': the budget is too small for this check"
    for r in said:
        number = re.search(r"The answer is\D*?(-?\d[\d,]*(?:\.\d+)?)", r["prediction"])[1].replace(",", "")
        assert float(r["answer"]) == float(number)
        assert r["scores"]["acc"] == float(float(number) == float(r["references"][0]))


PAPER_PROMPTS = {
    "nq": "NaturalQuestions/dev/nq_prompt.txt",
    "triviaqa": "TriviaQA/prompt.txt",
    "squad": "SQUAD/squad_prompt.txt",
    "gsm8k": "GSM/gsm_prompt.txt",
    "flores_en_de": "Flores/flores_en2deu_prompt.txt",
    "flores_de_en": "Flores/flores_deu2en_prompt.txt",
}


# The variant, its prompt file and its paper_* scores are the runner's, the same for every method: the
# ensemble decodes two short paper prompts (NQ's and FLORES De-En's, under 200 tokens), SmolLM2 alone the rest.
PAPER_METHOD = {"nq": "adafuse", "flores_de_en": "adafuse"}


@pytest.mark.parametrize("task", TASKS)
def test_the_papers_variant_and_prompt_file_decode_end_to_end(task, tmp_path):
    prompt_file = SHARED_DATA / "adafuse_local_datasets" / PAPER_PROMPTS[task]
    out = tmp_path / "run"
    extra = ["data.variant=paper", f"task.prompt_file={prompt_file}", "task.limit=1", "task.max_new_tokens=8"]
    method = PAPER_METHOD.get(task, "single")
    metrics = run_task(task, method, out, *extra)
    (record,) = read_predictions(out)
    text = prompt_file.read_text()
    assert record["prompt"].startswith(text) and record["prompt"][len(text) :].startswith("\n\nQuestion: ")
    assert len(record["stats"]["tokens_generated"]) == (2 if method == "adafuse" else 1)  # every model decoded
    assert metrics["variant"] == "paper" and metrics["n"] == 1
    assert any(name.startswith("paper_") for name in metrics["metrics"])
    scored_as_written(out, metrics)  # paper_* too, from the written prediction
    assert_a_right_answer_gets_full_marks(out)
