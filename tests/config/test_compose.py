"""Every config group combination composes; bad inputs fail before any model loads, naming the problem."""

import os
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from adafuse.ensemble import MODEL_CONFIGS, model_config
from adafuse.methods import METHODS as REGISTERED
from conf.compose import compose_run
from conf.schema import check_known_keys, run_id
from eval.collect import Run
from eval.runner import settings_of
from tests.support.paths import ROOT

PAIRS = sorted(p.stem for p in (ROOT / "conf/model_pair").glob("*.yaml"))
METHODS = sorted(p.stem for p in (ROOT / "conf/method").glob("*.yaml"))
TASKS = sorted(p.stem for p in (ROOT / "conf/task").glob("*.yaml"))


def test_the_groups_hold_what_the_paper_needs():
    assert {"tiny", "llama_mistral", "qwen_llama"} <= set(PAIRS)
    assert {"adafuse", "single"} <= set(METHODS)
    assert {"nq", "squad", "triviaqa", "gsm8k", "flores_en_de", "flores_de_en", "custom"} <= set(TASKS)


def declared(group: str, name: str) -> dict:
    """The values a group option's YAML sets itself (its defaults list left out)."""
    values = yaml.safe_load((ROOT / "conf" / group / f"{name}.yaml").read_text()) or {}
    values.pop("defaults", None)
    return values


# One composition per option of each group, the other groups at their defaults: the groups do not
# interact except through pair_defaults, which the pair test checks.
@pytest.mark.parametrize("pair", PAIRS)
def test_each_model_pair_composes_to_the_models_it_names(pair):
    settings = settings_of(compose_run(f"model_pair={pair}"))
    defaults = yaml.safe_load((ROOT / "conf" / "model_pair" / f"{pair}.yaml").read_text())["defaults"]
    named = {
        key.split("@members.")[1]: model
        for entry in defaults
        if isinstance(entry, dict)
        for key, model in entry.items()
        if key.startswith("/model@members.")
    }
    assert settings.model_pair.name == pair and len(named) >= 2
    assert list(settings.model_pair.members) == list(named)
    for key, model in named.items():
        member = settings.model_pair.members[key]
        assert {field: getattr(member, field) for field in declared("model", model)} == declared("model", model)
    # pair_defaults/<pair>.yaml (tiny, and small through it) slices the task to 50 examples
    assert settings.task.limit == (50 if (ROOT / "conf" / "pair_defaults" / f"{pair}.yaml").is_file() else None)


@pytest.mark.parametrize("method", METHODS)
def test_each_method_composes_to_its_registered_knobs(method):
    settings = settings_of(compose_run(f"method={method}"))
    knobs = REGISTERED[method].config
    assert isinstance(settings.method, knobs) and settings.method.name == method
    expected = knobs(**{k: v for k, v in declared("method", method).items() if k != "name"})
    assert {f.name: getattr(settings.method, f.name) for f in fields(knobs)} == asdict(expected)


@pytest.mark.parametrize("task", TASKS)
def test_each_task_composes_to_its_declared_settings(task):
    extra = ["task.path=prompts.jsonl"] if task == "custom" else []
    settings = settings_of(compose_run(f"task={task}", *extra))
    values = declared("task", task) | ({"path": "prompts.jsonl"} if task == "custom" else {})
    assert {field: getattr(settings.task, field) for field in values} == values
    assert settings.task.limit == 50  # the default pair's slice


def test_the_papers_main_command_composes_to_the_full_benchmark_on_the_hub():
    settings = settings_of(compose_run("model_pair=llama_mistral", "task=nq"))
    members = list(settings.model_pair.members.values())
    assert [m.path for m in members] == ["meta-llama/Llama-3.1-8B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3"]
    assert all(m.dtype == "bfloat16" and not m.trust_remote_code for m in members)
    assert settings.task.limit is None  # all 3,610 questions
    assert (settings.method.tau, settings.method.max_words, settings.method.branches) == (0.7, 3, 3)


def test_the_embedded_default_is_the_tiny_pair_on_a_slice():
    settings = settings_of(compose_run())
    assert settings.model_pair.name == "tiny" and settings.method.name == "adafuse" and settings.task.name == "nq"
    assert [m.bundle for m in settings.model_pair.members.values()] == ["smollm2_135m", "gemma3_270m"]
    assert settings.task.limit == 50
    assert settings_of(compose_run("task.limit=5")).task.limit == 5


def test_no_model_trusts_remote_code_and_every_hub_model_names_its_revision():
    """InternLM3 too loads with transformers' own support (tests/engine/test_loading.py); each hub model's revision
    is what a run resolves to a commit and records."""
    configs = [model_config(path.stem) for path in sorted(MODEL_CONFIGS.glob("*.yaml"))]
    assert [m.name for m in configs if m.trust_remote_code] == []
    assert {m.name: m.revision for m in configs if m.bundle is None} == {
        name: "main" for name in ("internlm3_8b_instruct", "llama31_8b_instruct", "mistral7b_instruct_v03", "qwen3_8b")
    }
    model = settings_of(compose_run("model@model_pair.members.m1=internlm3_8b_instruct")).model_pair.members["m1"]
    assert not model.trust_remote_code and model.path == "internlm/internlm3-8b-instruct"


@pytest.mark.parametrize(
    "override, valid",
    [
        ("task=nqq", "flores_de_en"),
        ("model_pair=llama", "llama_mistral"),
        ("method=adafus", "adafuse"),
        ("model@model_pair.members.m0=smol", "smollm2_135m"),
    ],
)
def test_unknown_group_options_list_the_valid_choices_and_no_schema(override, valid):
    with pytest.raises(MissingConfigException) as err:
        compose_run(override)
    choices = str(err.value).split("Available options")[1].split("Config search path")[0].split()
    group = override.split("=")[0].split("@")[0]
    assert valid in choices
    assert sorted(choices[2:]) == sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


def test_tau_above_one_is_accepted():
    assert settings_of(compose_run("method.tau=1.5")).method.tau == 1.5


def test_misspelt_keys_fail_at_compose_time():
    """Hydra's own refusal; the same key added with + is refused when the settings are built
    (tools/bad_inputs.py, tests/config/test_bad_inputs.py)."""
    with pytest.raises((ConfigCompositionException, ConfigAttributeError, ConfigKeyError)):
        compose_run("method.taux=0.5")
    with pytest.raises((ConfigCompositionException, ConfigAttributeError, ConfigKeyError)):
        compose_run("task.limt=5")


def test_every_key_each_option_sets_is_one_its_schema_declares():
    """The check that refuses a key no schema declares passes every option of every group (protocol=paper
    with each method: its protocol_method files)."""
    for overrides in [
        *([f"model_pair={pair}"] for pair in PAIRS),
        *([f"task={task}", "task.path=prompts.jsonl"] for task in TASKS),
        *([f"method={method}", "protocol=paper"] for method in METHODS),
    ]:
        check_known_keys(compose_run(*overrides))


def run_id_of(*overrides: str) -> str:
    return Path(compose_run(*overrides, hydra=True).hydra.run.dir).name


def test_the_run_id_names_the_settings_that_change_predictions():
    assert run_id_of() == "default"
    assert run_id_of("method.tau=0.5", "task.max_new_tokens=8") == "method.tau=0.5,task.max_new_tokens=8"
    assert "/" not in run_id("task.path=/home/me/prompts.jsonl")


def test_results_dir_moves_the_root_and_stays_out_of_the_run_id():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["results_dir=results/grid", "method.tau=0.5"], return_hydra_config=True)
    assert run_id(cfg.hydra.job.override_dirname) == "method.tau=0.5"
    assert cfg.hydra.run.dir == "results/grid/nq/adafuse/tiny/method.tau=0.5"
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["results_dir=/scratch/me", "method.tau=0.5"], return_hydra_config=True)
    assert cfg.hydra.sweep.subdir == "/scratch/me/nq/adafuse/tiny/method.tau=0.5"  # a sweep job too


def test_batch_size_is_in_the_run_id_only_when_batching_is_not_exact():
    assert run_id_of("batch_size=4") == "default"
    assert run_id_of("batch_exact=false", "batch_size=4") == "batch_exact=false,batch_size=4"
    assert run_id_of("batch_exact=false") == "batch_exact=false,batch_size=8"


def test_slice_size_and_shards_are_not_in_the_run_id():
    # A larger task.limit grows the same run in place; every shard writes into the same directory.
    assert run_id_of("method.tau=0.5", "task.limit=5", "task.num_shards=4", "task.shard=3") == "method.tau=0.5"


def test_stop_strings_from_the_command_line_take_escapes():
    # What the shell passes for the README's task.stop='["\n"]': a backslash and an n.
    settings = settings_of(compose_run("task=custom", "task.path=p.jsonl", r'task.stop=["\n","a\tb","c\\n"]'))
    assert settings.task.stop == ["\n", "a\tb", "c\\n"]
    assert settings_of(compose_run("task=nq")).task.stop == ["\n"]  # YAML's "\n" is already a newline
    # Python's other escapes too; an unknown one is refused (tools/bad_inputs.py)
    settings = settings_of(compose_run("task=custom", "task.path=p.jsonl", r"task.stop=['\r\n','\x41','\u000a']"))
    assert settings.task.stop == ["\r\n", "A", "\n"]


def test_a_run_id_whose_values_hold_commas_splits_back_into_its_overrides():
    run_dir = Path(compose_run("method=unite", "method.weights=[0.5,0.5]", "method.top_k=5", hydra=True).hydra.run.dir)
    assert run_dir.name == "method.top_k=5,method.weights=[0.5,0.5]"
    assert Run(run_dir, {}, {}).overrides == ["method.top_k=5", "method.weights=[0.5,0.5]"]


def test_sweep_bookkeeping_stays_out_of_the_results_tree():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "method.tau=0.5"], return_hydra_config=True)
    # Hydra joins sweep.dir and subdir; the subdir is absolute, so a job writes where a single run does.
    assert cfg.hydra.sweep.subdir == f"{os.getcwd()}/results/nq/adafuse/tiny/method.tau=0.5"
    assert cfg.hydra.sweep.dir.startswith("multirun/")  # multirun.yaml
    assert cfg.hydra.launcher.submitit_folder == f"{cfg.hydra.sweep.dir}/.submitit/%j"


def test_a_run_id_too_long_for_a_file_name_keeps_its_start_and_a_digest_of_the_whole():
    """Models given by long absolute paths (the GPU check's, a cluster's scratch disk) made a run directory's name
    longer than a file name may be; it is cut to its start and a digest, one name per set of overrides."""
    long = [f"model_pair.members.m{k}.path=/scratch/{'x' * 150}/model_{k}" for k in range(2)]
    name = run_id(",".join(long))
    assert len(name.encode()) <= 200 and name.startswith("model_pair.members.m0.path=%scratch%")
    assert name == run_id(",".join(long)) and name != run_id(",".join(long[::-1]))
    assert run_id("method.tau=0.5") == "method.tau=0.5"
