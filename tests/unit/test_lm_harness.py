"""The lm_eval model's registration beside lm_eval's own models, and the written task files' prompts
(eval/lm_harness.py, eval/lm_tasks.py); no model runs. Its bad arguments are tools/bad_inputs.py's
(tests/config/test_bad_inputs.py)."""

import pytest
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from conf.compose import compose_run
from eval.lm_harness import AdaFuseLM, _request
from eval.lm_tasks import main as write_tasks_command
from eval.lm_tasks import write_tasks
from eval.runner import settings_of
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
