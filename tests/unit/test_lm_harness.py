"""The lm_eval model's registration beside lm_eval's own models, and the written task files' prompts
(eval/lm_harness.py, eval/lm_tasks.py); no model runs. Its bad arguments are tools/bad_inputs.py's
(tests/config/test_bad_inputs.py)."""

import json

import pytest
import torch
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from adafuse import Ensemble
from conf.compose import compose_run
from eval.lm_harness import AdaFuseLM, _request, on_device
from eval.lm_tasks import main as write_tasks_command
from eval.lm_tasks import write_tasks
from eval.runner import model_configs, settings_of
from eval.tasks import Task
from tests.support.paths import SHARED_DATA


def test_the_model_is_registered_beside_lm_evals_own():
    assert get_model("adafuse") is AdaFuseLM
    assert get_model("hf").__name__ == "HFLM"


def test_unknown_task_names_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        write_tasks_command([str(tmp_path), "--data-dir", str(SHARED_DATA), "--tasks", "nq,mmlu"])
    assert "mmlu" in capsys.readouterr().err


@pytest.mark.parametrize("variant", ["canonical", "paper"])
def test_written_tasks_give_the_runners_prompts_and_stops(tmp_path, variant):
    names = ["nq", "triviaqa", "squad", "gsm8k", "flores_en_de", "flores_de_en"]
    write_tasks(tmp_path, str(SHARED_DATA), variant, names, limit=2)
    tasks = TaskManager(include_path=str(tmp_path)).load([f"adafuse_{n}" for n in names])["tasks"]
    for name in names:
        settings = settings_of(
            compose_run(f"task={name}", f"data.dir={SHARED_DATA}", f"data.variant={variant}", "task.limit=2")
        )
        ours = Task(settings.task, settings.data)
        theirs = tasks[f"adafuse_{name}"]
        theirs.build_all_requests(limit=2)
        requests = sorted(theirs.instances, key=lambda r: r.doc_id)
        assert [r.args[0] for r in requests] == [ours.prompt(e) for e in ours.examples], name
        for request in requests:
            assert request.args[1]["until"] == list(settings.task.stop)
            assert request.args[1]["max_gen_toks"] == settings.task.max_new_tokens
            # the adapter splits lm_eval's context where the runner splits the prompt
            assert _request(*request.args).prefix == ours.prefix, name


def test_lm_evals_device_places_the_pair_as_run_py_does(monkeypatch):
    """--device cuda (lm_eval's default) on a node of two GPUs: a GPU per member, as run.py's device auto; a device
    named with its index, or the CPU, takes every member."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    pair = model_configs("tiny", None)
    assert [c.device for c in Ensemble.placed(on_device(pair, "cuda"))] == ["cuda:0", "cuda:1"]
    assert [c.device for c in Ensemble.placed(on_device(pair, "cuda:1"))] == ["cuda:1", "cuda:1"]
    assert [c.device for c in Ensemble.placed(on_device(pair, "cpu"))] == ["cpu", "cpu"]


def test_a_task_outside_the_six_is_written_with_its_settings(tmp_path, capsys):
    lines = [{"id": f"q{i}", "prompt": f"Question: {i} + {i}?\nAnswer:", "references": [str(2 * i)]} for i in range(3)]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "tasks"
    write_tasks_command([str(out), "--tasks", "custom", f"task.path={tmp_path / 'mine.jsonl'}", 'task.stop=["\\n"]'])
    assert capsys.readouterr().out.strip() == str(out / "adafuse_custom.yaml")
    (task,) = TaskManager(include_path=str(out)).load(["adafuse_custom"])["tasks"].values()
    task.build_all_requests(limit=3)
    requests = sorted(task.instances, key=lambda r: r.doc_id)
    assert [r.args[0] for r in requests] == [line["prompt"] for line in lines]
    assert requests[0].args[1]["until"] == ["\n"] and task.config.metric_list[0]["metric"] == "exact_match"
