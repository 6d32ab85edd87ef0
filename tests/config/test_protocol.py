"""protocol=paper composes to the paper's files, prompt files, decoder, scorers and the baselines' upstream
settings, in run directories of its own; protocol=none (the default) changes nothing."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conf.compose import compose_run
from eval.runner import settings_of
from eval.tasks import Task
from tests.support.paths import ROOT, SHARED_DATA

PAPER_TASKS = ["nq", "squad", "triviaqa", "gsm8k", "flores_en_de", "flores_de_en"]
PAPER_PROMPT_FILES = {
    "nq": "NaturalQuestions/dev/nq_prompt.txt",
    "squad": "SQUAD/squad_prompt.txt",
    "triviaqa": "TriviaQA/prompt.txt",
    "gsm8k": "GSM/gsm_prompt.txt",
    "flores_en_de": "Flores/flores_en2deu_prompt.txt",
    "flores_de_en": "Flores/flores_deu2en_prompt.txt",
}


def run_dir_of(*overrides: str) -> str:
    return compose_run(*overrides, hydra=True).hydra.run.dir


@pytest.mark.parametrize("task", PAPER_TASKS)
def test_protocol_paper_sets_the_papers_files_prompt_decoder_and_run_id(task):
    settings = settings_of(compose_run(f"task={task}", "protocol=paper"))
    assert settings.protocol == "paper" and settings.data.variant == "paper"
    assert settings.task.prompt_file == settings.task.paper_prompt_file
    assert settings.task.prompt_file == f"adafuse_local_datasets/{PAPER_PROMPT_FILES[task]}"
    assert (SHARED_DATA / settings.task.prompt_file).is_file()
    assert settings.task.paper_query is not None
    method = settings.method
    assert (method.name, method.tau, method.branches, method.span_length, method.max_rounds) == (
        "adafuse_code",
        0.7,
        3,
        1,
        5,
    )
    assert run_dir_of(f"task={task}", "protocol=paper") == f"results/{task}/adafuse_code/tiny/protocol=paper"


@pytest.mark.parametrize("task", PAPER_TASKS)
def test_the_protocols_prompt_is_the_papers_file_then_their_query(task):
    settings = settings_of(compose_run(f"task={task}", "protocol=paper", "task.limit=1", f"data.dir={SHARED_DATA}"))
    t = Task(settings.task, settings.data)
    text = (SHARED_DATA / settings.task.paper_prompt_file).read_text(encoding="utf-8")
    prompt = t.prompt(t.examples[0])
    assert prompt.startswith(text) and prompt.endswith(("\nAnswer:", "Let's think step by step\n"))
    assert prompt[len(text) :].startswith("\n\nQuestion: ")
    assert t.examples[0].id.split("-")[0] == {"gsm8k": "gsm", "flores_en_de": "flores", "flores_de_en": "flores"}.get(
        task, {"triviaqa": "tqa"}.get(task, task)
    )
    assert t.primary_metric(paper=True).startswith("paper_") and not t.primary_metric().startswith("paper_")


def test_the_papers_main_command_composes_under_the_protocol():
    overrides = ("model_pair=llama_mistral", "task=nq", "protocol=paper")
    settings = settings_of(compose_run(*overrides))
    assert settings.model_pair.name == "llama_mistral" and settings.task.limit is None
    assert settings.method.name == "adafuse_code" and settings.data.variant == "paper"
    assert run_dir_of(*overrides) == "results/nq/adafuse_code/llama_mistral/protocol=paper"


def test_baselines_follow_their_upstream_code_under_the_protocol():
    def method(*overrides: str):
        return settings_of(compose_run("protocol=paper", *overrides)).method

    assert method("method=llm_blender").ranker == "pairrm"
    assert method("method=deepen").main == "sentencepiece"
    assert method("method=sweetspan").score == "perplexity"
    # ... and only under it
    assert settings_of(compose_run("method=llm_blender")).method.ranker == "nll"
    assert settings_of(compose_run("method=deepen")).method.main == 0
    assert settings_of(compose_run("method=sweetspan")).method.score == "nll"
    # the command line still wins, and its choice is in the run id
    assert method("method=llm_blender", "method.ranker=nll").ranker == "nll"
    assert run_dir_of("protocol=paper", "method=deepen", "method.main=0").endswith(
        "deepen/tiny/method.main=0,protocol=paper"
    )
    for name in ("unite", "single"):  # no upstream difference: their defaults, the protocol's data and prompts
        plain, paper = (
            OmegaConf.to_container(compose_run(f"method={name}", *p).method) for p in ((), ("protocol=paper",))
        )
        assert plain == paper
        assert run_dir_of(f"method={name}", "protocol=paper").endswith(f"{name}/tiny/protocol=paper")


def test_a_method_named_on_the_command_line_runs_under_the_protocol():
    # protocol=paper's decoder is adafuse_code only where no method is named: method=adafuse keeps the paper's
    # algorithm (our spec) with the paper's files, prompts and scorers, in a run directory of its own.
    settings = settings_of(compose_run("protocol=paper", "method=adafuse"))
    assert settings.method.name == "adafuse" and settings.data.variant == "paper" and settings.task.prompt_file
    assert run_dir_of("protocol=paper", "method=adafuse") == "results/nq/adafuse/tiny/protocol=paper"


def test_protocol_none_is_the_default_and_changes_nothing():
    assert OmegaConf.to_container(compose_run()) == OmegaConf.to_container(compose_run("protocol=none"))
    settings = settings_of(compose_run())
    assert settings.protocol == "none" and settings.data.variant == "canonical" and settings.task.prompt_file is None
    assert settings.method.name == "adafuse"
    assert run_dir_of() == "results/nq/adafuse/tiny/default"
    assert sorted(p.stem for p in (ROOT / "conf/protocol").glob("*.yaml")) == ["none", "paper"]


def test_a_relative_prompt_file_outside_data_dir_is_read_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "mine.txt").write_text("My prompt\n")
    monkeypatch.chdir(tmp_path)
    settings = settings_of(compose_run("task.prompt_file=mine.txt", "task.limit=1", f"data.dir={SHARED_DATA}"))
    t = Task(settings.task, settings.data)
    assert t.prompt_file_path() == Path("mine.txt") and t.prompt(t.examples[0]).startswith("My prompt\n\n\nQuestion:")
