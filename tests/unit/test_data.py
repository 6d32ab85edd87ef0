"""Readers for every benchmark source in ../shared/data, their errors, and prompt assembly."""

import json

import pytest
from omegaconf import OmegaConf

from adafuse import Request
from adafuse.errors import ConfigError, DataError
from conf.compose import compose_run
from conf.schema import DataConf, TaskConf
from eval.data import HUB, read_local
from eval.tasks import Task


def task_of(name: str, shared_data, variant="canonical", **overrides) -> Task:
    overrides = {"limit": "null", **overrides}  # the whole benchmark, not the tiny pair's slice
    cfg = compose_run(f"task={name}", *(f"task.{k}={v}" for k, v in overrides.items()))
    task_cfg = OmegaConf.to_object(cfg.task)
    return Task(task_cfg, DataConf(dir=str(shared_data), variant=variant))


@pytest.mark.parametrize(
    "task, variant, n",
    [
        ("nq", "canonical", 3610),
        ("nq", "paper", 3610),
        ("triviaqa", "canonical", 11313),
        ("triviaqa", "paper", 1900),
        ("squad", "canonical", 10570 - 206),  # the last dev article supplies the exemplars
        ("squad", "paper", 2500),
        ("gsm8k", "canonical", 1319),
        ("gsm8k", "paper", 1319),
        ("flores_en_de", "canonical", 1012),
        ("flores_de_en", "paper", 1012),
    ],
)
def test_each_source_reads_every_record(task, variant, n, shared_data):
    t = task_of(task, shared_data, variant)
    assert len(t.examples) == n
    assert len({e.id for e in t.examples}) == n  # ids are unique: resume keys on them
    assert all(e.references and all(r for r in e.references) for e in t.examples)
    assert len(t.shots) == t.cfg.num_fewshot


def test_exemplars_never_come_from_the_scored_examples(shared_data):
    for name in ("nq", "triviaqa", "squad", "gsm8k", "flores_en_de"):
        for variant in ("canonical", "paper"):
            t = task_of(name, shared_data, variant)
            scored = {e.id for e in t.examples}
            texts = {e.fields.get("question", e.fields.get("source")) for e in t.examples}
            assert not {s.id for s in t.shots} & scored
            assert not {s.fields.get("question", s.fields.get("source")) for s in t.shots} & texts


def test_references_and_fields_match_the_files(shared_data):
    nq = task_of("nq", shared_data)
    assert nq.examples[0].fields["question"] == "when was the last time anyone was on the moon"
    assert nq.examples[0].references == ["14 December 1972 UTC", "December 1972"]
    gsm = task_of("gsm8k", shared_data)
    assert gsm.examples[0].references == ["18"] and "<<" not in gsm.shots[0].fields["solution"]
    paper = task_of("gsm8k", shared_data, "paper")
    assert [e.references for e in paper.examples] == [e.references for e in gsm.examples]
    squad = task_of("squad", shared_data, "paper")
    assert squad.examples[0].fields["context"].startswith("The Normans")
    assert squad.examples[0].references == ["France", "France", "France", "France"]
    tqa = task_of("triviaqa", shared_data)
    assert tqa.examples[0].fields["question"] == "Who was the man behind The Chipmunks?"
    assert tqa.examples[0].references == ["David Seville"]
    de = task_of("flores_de_en", shared_data)
    assert de.examples[0].references[0].startswith('"We now have 4-month-old mice')


def test_prompts_hold_instruction_exemplars_and_query(shared_data):
    t = task_of("nq", shared_data)
    prompt = t.prompt(t.examples[0])
    assert prompt.startswith(t.cfg.instruction)
    assert prompt.endswith("Question: when was the last time anyone was on the moon?\nAnswer:")
    assert prompt.count("\nAnswer:") == 6
    assert all(f"Question: {s.fields['question']}?\nAnswer: {s.fields['answer']}" in prompt for s in t.shots)
    again = task_of("nq", shared_data)
    assert [s.id for s in again.shots] == [s.id for s in t.shots]  # seeded: every run sees the same exemplars
    other = task_of("nq", shared_data, fewshot_seed=7)
    assert [s.id for s in other.shots] != [s.id for s in t.shots]
    # every prompt starts with the task's prefix, read once for all of them (Request.prefix)
    assert t.prefix.endswith(f"Answer: {t.shots[-1].fields['answer']}\n\n") and t.prefix.startswith(t.cfg.instruction)
    assert t.prefix == t.preamble and all(t.prompt(e) == t.preamble + t.query.format(**e.fields) for e in t.examples)
    with pytest.raises(ValueError, match="is not the start of the prompt"):
        Request("Question: who?\nAnswer:", prefix=t.prefix)


def test_the_papers_prompt_files_give_the_papers_exact_prompts(shared_data):
    prompt_file = shared_data / "adafuse_local_datasets/GSM/gsm_prompt.txt"
    t = task_of("gsm8k", shared_data, "paper", prompt_file=str(prompt_file))
    assert t.shots == []
    question = t.examples[0].fields["question"]
    assert t.prompt(t.examples[0]) == prompt_file.read_text() + f"\n\nQuestion: {question}\nLet's think step by step\n"
    assert t.preamble == prompt_file.read_text() and t.prefix == t.preamble + "\n\n"  # the query's blank line
    with pytest.raises(DataError, match="nowhere.txt does not exist"):
        task_of("nq", shared_data, prompt_file="/nowhere.txt")


def test_limit_takes_the_first_examples_in_order(shared_data):
    full, five = task_of("gsm8k", shared_data), task_of("gsm8k", shared_data, limit=5)
    assert [e.id for e in five.examples] == [e.id for e in full.examples[:5]]
    with pytest.raises(ConfigError, match="task.limit must be >= 1"):
        task_of("gsm8k", shared_data, limit=0)


def test_malformed_lines_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": ["b"]}\n{"question": "c", "answer": \n')
    with pytest.raises(DataError, match=f"{bad}:2: malformed JSON"):
        read_local({"reader": "qa_jsonl", "file": str(bad), "prefix": "x"}, None)
    bad.write_text('{"question": "a", "answer": ["b"]}\n{"question": "c"}\n')
    with pytest.raises(DataError, match=f"{bad}:2: missing field 'answer'"):
        read_local({"reader": "qa_jsonl", "file": str(bad), "prefix": "x"}, None)
    bad.write_text('{"id": 1, "prompt": "p"}\n{"id": 1, "prompt": "q"}\n')
    with pytest.raises(DataError, match=f"{bad}:2: duplicate id '1'"):
        read_local({"reader": "prompts_jsonl", "file": str(bad)}, None)
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("q1\t['a']\nq2\tnot a list\n")
    with pytest.raises(DataError, match=f"{tsv}:2: answers are not a Python list literal"):
        read_local({"reader": "dpr_tsv", "file": str(tsv), "prefix": "x"}, None)
    src, tgt = tmp_path / "s", tmp_path / "t"
    src.write_text("a\nb\n")
    tgt.write_text("a\n")
    with pytest.raises(DataError, match="must align"):
        read_local({"reader": "flores_pair", "source": str(src), "target": str(tgt), "prefix": "x"}, None)


def test_missing_and_empty_data_say_so(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_local({"reader": "qa_jsonl", "file": "nq_open/NQ-open.dev.jsonl", "prefix": "x"}, tmp_path)
    (tmp_path / "nq_open").mkdir()
    (tmp_path / "nq_open/NQ-open.dev.jsonl").write_text("")
    cfg = OmegaConf.to_object(compose_run("task=nq").task)
    with pytest.raises(DataError, match="hold no examples"):
        Task(cfg, DataConf(dir=str(tmp_path)))


def test_custom_prompts_are_used_verbatim(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "Q: 2+2?\nA:", "references": ["4"]}) + "\n")
    cfg = OmegaConf.to_object(compose_run("task=custom", f"task.path={path}").task)
    t = Task(cfg, DataConf(dir=None))
    assert t.prompt(t.examples[0]) == "Q: 2+2?\nA:"
    assert t.score(t.examples[0], " 4\n") == ("4", {"em": 1.0, "f1": 1.0})


def test_hub_rows_convert_like_local_files():
    assert HUB["nq_hub"]([{"question": "who", "answer": ["me"]}], prefix="nq")[0].references == ["me"]
    row = {"question": "Q?", "question_id": "tc_1", "answer": {"aliases": ["A", "B"], "value": "A"}}
    assert HUB["trivia_hub"]([row], prefix="tqa")[0].id == "tqa-0"  # its place, as the local file's ids
    row = {"id": "x1", "context": "C", "question": "Q", "answers": {"text": ["a", "b"], "answer_start": [0, 1]}}
    assert HUB["squad_hub"]([row])[0].fields == {"question": "Q", "answer": "a", "context": "C"}
    row = {"question": "Q", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"}
    gsm = HUB["gsm_hub"]([row], prefix="gsm")[0]
    assert gsm.references == ["4"] and gsm.fields["solution"] == "2 + 2 = 4"


def test_hub_access_errors_point_to_local_data(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from eval.data import read_hub

    with pytest.raises(DataError, match="data.dir"):
        read_hub({"reader": "nq_hub", "path": "google-research-datasets/nq_open", "split": "validation", "prefix": "n"})


def test_taskconf_schema_is_what_the_yaml_uses():
    assert set(OmegaConf.to_container(compose_run("task=nq").task)) <= set(TaskConf.__dataclass_fields__)
