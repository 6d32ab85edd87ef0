"""A run directory admits only processes that compute as its predictions were computed (the same
settings, the same data and models, torch, and each model's device, dtype and GPU), even when they start at
the same time; a run directory that cannot be written is a named error; each process's batching report adds
up."""

import json
import multiprocessing
import re

import pytest
import yaml

from adafuse.errors import ConfigError, ResultsDirError, ResumeMismatchError
from eval.results import RunDir, read_predictions

SETTINGS = {"task": {"name": "nq", "limit": 4, "shard": 0, "num_shards": 2}, "method": {"name": "adafuse"}}


def runtime(device="cpu", dtype="float32", gpu=None, torch="2.9.1+cpu") -> dict:
    models = [{"name": "smollm2_135m", "device": device, "dtype": dtype, "gpu": gpu}]
    return {
        "torch": torch,
        "models": models + [{"name": "gemma3_270m", "device": "cpu", "dtype": "float32", "gpu": None}],
    }


def config(shard=0, **where) -> dict:
    return {**SETTINGS, "task": {**SETTINGS["task"], "shard": shard}, "runtime": runtime(**where)}


def record(example_id: str) -> dict:
    return {"id": example_id, "prediction": "Paris"}


@pytest.mark.parametrize(
    "where, differs",
    [
        ({"device": "cuda:0", "dtype": "bfloat16", "gpu": "NVIDIA H200"}, "smollm2_135m device cpu then, cuda:0 now"),
        ({"dtype": "bfloat16"}, "smollm2_135m dtype float32 then, bfloat16 now"),
        ({"torch": "2.10.0+cpu"}, "torch 2.9.1+cpu then, 2.10.0+cpu now"),
    ],
)
def test_a_resume_on_another_device_dtype_or_torch_is_refused_and_says_what_differs(tmp_path, where, differs):
    RunDir(tmp_path, config()).admit().append(record("nq-0"))
    with pytest.raises(ResumeMismatchError, match=re.escape(differs)) as refused:
        RunDir(tmp_path, config(shard=1, **where)).check()
    assert "resume it on its recorded device and dtype" in str(refused.value)
    assert isinstance(refused.value, ConfigError)  # a bad input, reported on one line by run.py
    RunDir(tmp_path, config(shard=1)).admit()  # the recorded runtime is admitted, from any shard


def test_a_run_without_a_recorded_runtime_resumes_and_records_this_one(tmp_path):
    legacy = RunDir(tmp_path, SETTINGS).admit()  # written before config.yaml recorded where it ran
    legacy.append(record("nq-0"))
    RunDir(tmp_path, config()).admit()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["runtime"] == runtime()


def local(folder="/data", nq="a" * 64) -> dict:
    return {"data": {"local": folder, "files": {"nq_open/NQ-open.dev.jsonl": nq}, "hub": []}, "models": MODELS}


def hub(commit="c" * 40) -> dict:
    split = {"dataset": "google-research-datasets/nq_open", "config": None, "split": "validation"}
    return {
        "data": {"local": None, "files": {}, "hub": [{**split, "revision": "main", "commit": commit}]},
        "models": MODELS,
    }


MODELS = [
    {"name": "llama31_8b_instruct", "hub": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main", "commit": "d" * 40}
]


@pytest.mark.parametrize(
    "then, now, differs",
    [
        (local(), hub(), "data from local files then, from the hub now"),
        (hub(), local(), "data from the hub then, from local files now"),
        (
            local(),
            local(nq="b" * 64),
            "data file nq_open/NQ-open.dev.jsonl: sha256 aaaaaaaaaaaa then, bbbbbbbbbbbb now",
        ),
        (
            hub(),
            hub(commit="e" * 40),
            "google-research-datasets/nq_open split validation at commit cccccccccccc then, eeeeeeeeeeee now",
        ),
        (
            hub(),
            {**hub(), "models": [{**MODELS[0], "commit": "f" * 40}]},
            "model llama31_8b_instruct commit dddddddddddd then, ffffffffffff now",
        ),
    ],
)
def test_a_resume_from_other_data_or_models_is_refused_and_says_what_differs(tmp_path, then, now, differs):
    """data.dir cannot change a prediction's settings, but what it resolves to can change its prompt: a run read
    from local files and one read from the hub (other exemplar pools; SQuAD's 206 more questions) share ids, and
    a hub branch moves. Their predictions never meet in one run."""
    RunDir(tmp_path, {**config(), "source": then}).admit().append(record("nq-0"))
    with pytest.raises(ResumeMismatchError, match=re.escape(differs)) as refused:
        RunDir(tmp_path, {**config(shard=1), "source": now}).check()
    assert "write this one to another directory" in str(refused.value)


def test_the_same_files_in_another_folder_are_the_same_data(tmp_path):
    RunDir(tmp_path, {**config(), "source": local("/data")}).admit().append(record("nq-0"))
    RunDir(tmp_path, {**config(shard=1), "source": local("/scratch/me/data")}).admit()


def test_changed_settings_are_a_resume_mismatch_too(tmp_path):
    RunDir(tmp_path, config()).admit().append(record("nq-0"))
    with pytest.raises(ResumeMismatchError, match="method.tau"):
        RunDir(tmp_path, {**config(), "method": {"name": "adafuse", "tau": 0.5}}).admit()


def test_shards_that_start_together_on_different_devices_never_mix_predictions(tmp_path):
    # Both are admitted while no prediction exists; the GPU shard's config.yaml replaces the CPU one's.
    cpu = RunDir(tmp_path, config(shard=0)).admit()
    gpu = RunDir(tmp_path, config(shard=1, device="cuda:0", dtype="bfloat16", gpu="NVIDIA H200")).admit()
    gpu.append(record("nq-1"))
    with pytest.raises(ResumeMismatchError, match="cuda:0"):
        cpu.append(record("nq-0"))
    assert list(read_predictions(tmp_path / "predictions.jsonl")) == ["nq-1"]
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["runtime"]["models"][0]["device"] == "cuda:0"


def test_shards_on_the_same_runtime_append_after_one_another_replaced_config_yaml(tmp_path):
    first = RunDir(tmp_path, config(shard=0)).admit()
    second = RunDir(tmp_path, config(shard=1)).admit()
    first.append(record("nq-0"))
    second.append(record("nq-1"))
    assert sorted(read_predictions(tmp_path / "predictions.jsonl")) == ["nq-0", "nq-1"]


def admit_and_append(path, where: dict, example_id: str, start) -> None:
    out = RunDir(path, config(**where)).admit()
    start.wait()
    try:
        out.append(record(example_id))
    except ResumeMismatchError:
        raise SystemExit(3) from None


def test_racing_processes_leave_only_predictions_of_the_recorded_runtime(tmp_path):
    fork = multiprocessing.get_context("fork")
    start = fork.Barrier(4)
    places = [{}, {"device": "cuda:0", "dtype": "bfloat16", "gpu": "NVIDIA H200"}] * 2
    writers = [
        fork.Process(target=admit_and_append, args=(tmp_path, where, f"nq-{i}", start))
        for i, where in enumerate(places)
    ]
    for p in writers:
        p.start()
    for p in writers:
        p.join()
    assert {p.exitcode for p in writers} <= {0, 3}
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["runtime"]["models"][0]["device"]
    written = read_predictions(tmp_path / "predictions.jsonl")
    assert written, "some writer had to be admitted"
    # Every prediction was written by a process on the device config.yaml records.
    assert {places[int(i.split("-")[1])].get("device", "cpu") for i in written} == {recorded}


@pytest.mark.parametrize("layout", ["parent is a file", "run directory is a file"])
def test_a_run_directory_that_cannot_be_created_is_a_named_error(tmp_path, layout):
    # Meaningful as root too (CI), whom permissions would not stop.
    blocker = tmp_path / "results"
    blocker.write_text("not a folder")
    run_dir = blocker / "nq" / "adafuse" if layout == "parent is a file" else blocker
    with pytest.raises(ResultsDirError, match=f"cannot create or write the run directory {run_dir}") as refused:
        RunDir(run_dir, config())
    assert "results_dir" in str(refused.value)
    if layout == "parent is a file":
        assert f"{blocker} is a file, not a folder" in str(refused.value)


def test_batching_reports_of_several_processes_add_up_and_a_disagreement_reads_mixed(tmp_path):
    """Counts add up; of the KV figures, the most any process held."""
    out = RunDir(tmp_path, config())
    assert out.batching() == {}
    exact = {"attention": "per_request", "linear": "merged", "passes": 10, "merged_passes": 4, "rows": 30}
    exact |= {"kv_peak_bytes": 900, "kv_peak_bytes_per_example": 300, "kv_prefix_bytes": 50, "longest_context": 40}
    out.append_batching(0, 3, {"smollm2_135m": exact})
    # the second process counted the prompts it read in merged passes and its passes' seconds; the first, older, did not
    later = {**exact, "linear": "per_request", "passes": 5, "rows": 7, "merged_prompts": 2, "seconds": 1.5}
    later |= {"backend": "cpu-exact", "host_seconds": 1.25}  # and the host's seconds and its backend's name
    later |= {"kv_peak_bytes": 800, "kv_peak_bytes_per_example": 400, "longest_context": 60}
    out.append_batching(1, 2, {"smollm2_135m": later})
    lines = [json.loads(line) for line in (tmp_path / "batching.jsonl").read_text().splitlines()]
    assert [(line["shard"], line["examples"]) for line in lines] == [(0, 3), (1, 2)]
    assert out.batching() == {
        "smollm2_135m": {
            "attention": "per_request",
            "linear": "mixed",
            "backend": "cpu-exact",
            "passes": 15,
            "merged_passes": 8,
            "rows": 37,
            "merged_prompts": 2,
            "prefix_passes": 0,
            "seconds": 1.5,
            "host_seconds": 1.25,
            "kv_peak_bytes": 900,
            "kv_peak_bytes_per_example": 400,
            "kv_prefix_bytes": 50,
            "longest_context": 60,
        }
    }


def gpu_config(batch_size: int, invariant: bool, passes: bool = True) -> dict:
    """A run on a GPU at `batch_size`; `passes`: the models' passes recorded (after they loaded), invariant or not."""
    where = config(device="cuda:0", dtype="bfloat16", gpu="NVIDIA H100 80GB HBM3") | {"batch_size": batch_size}
    if passes:
        for model in where["runtime"]["models"]:
            failing = [] if invariant else ["linear", "attention"]
            model["passes"] = {"backend": "cuda", "batch_invariant": invariant, "failing": failing}
    return where


def test_a_batch_dependent_run_resumes_only_at_its_batch_size_and_says_why(tmp_path):
    """Where a model's passes were recorded as batch-dependent (a GPU whose kernels keep no row's bits), the run's
    outputs depend on its batch size: a process at another is refused before any model loads (its own runtime
    records no passes yet), naming the models, the GPU and the ops; one at the same batch size resumes."""
    RunDir(tmp_path, gpu_config(8, invariant=False)).admit().append(record("nq-0"))
    with pytest.raises(ResumeMismatchError, match="batch-dependent") as refused:
        RunDir(tmp_path, gpu_config(32, invariant=False, passes=False)).check()
    message = str(refused.value)
    assert "smollm2_135m on NVIDIA H100 80GB HBM3: linear, attention" in message and "batch_size=8" in message
    RunDir(tmp_path, gpu_config(8, invariant=False, passes=False)).check()


def test_an_invariant_run_resumes_at_any_batch_size(tmp_path):
    RunDir(tmp_path, gpu_config(8, invariant=True)).admit().append(record("nq-0"))
    RunDir(tmp_path, gpu_config(32, invariant=True, passes=False)).check()
