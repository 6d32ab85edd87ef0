"""tools/gpu_full.py (`python -m tools.gpu_check --full`): the paper's pair on the user's path on a GPU. Its dry
run runs every step on the CPU (hidden 256, 2 layers, the real vocabularies and tokenizers, the pair written to
disk in shards and decoded through run.py, the kernels under Triton's interpreter), so the check cannot rot
between the rare calls on a GPU machine; what a GPU adds (memory per GPU, probe seconds, launches, kernels' bits
on hardware) is the GPU's to fill in."""

import json
import subprocess
import sys

import pytest

from adafuse.backend.cuda import available
from tests.support.paths import ROOT
from tools import gpu_full, render_docs

RUNS = [run.name for run in gpu_full.FIRST + gpu_full.WARM]
PROMPTS = {
    run.name: gpu_full.DRY_RUN.prompts[run.prompts]
    for run in gpu_full.FIRST + gpu_full.WARM
    if isinstance(run, gpu_full.Run)
}


@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_records_it(shared_data, tmp_path, require):
    require(available(), "triton")  # the op report's kernels, under the interpreter
    out = tmp_path / "gpu_full.json"
    command = ["-m", "tools.gpu_check", "--full", "--dry-run", "--data-dir", str(shared_data), "--out", str(out)]
    subprocess.run([sys.executable, *command, "--work", str(tmp_path / "work")], cwd=ROOT, check=True)
    record = json.loads(out.read_text())
    assert list(record) == ["check", "environment", "build", "ops", "runs", "identical", "ratios"] + [
        "probe_time",
        "goals",
    ]
    assert record["check"]["plan"] == ["build", "ops", *RUNS]

    build = record["build"]["models"]  # written to disk at the check's sizes, in the hub's shards
    assert {name: model["vocab"] for name, model in build.items()} == {
        "llama31_8b_instruct": 128256,
        "mistral7b_instruct_v03": 32768,
    }
    assert {model["layers"] for model in build.values()} == {2} and build["llama31_8b_instruct"]["files"] > 1
    layer = 2 * 256 * 256 + 2 * 64 * 256 + 3 * 256 * 512 + 2 * 256  # q, o; k, v (one key/value head); MLP; norms
    assert build["llama31_8b_instruct"]["parameters"] == 2 * 128256 * 256 + 2 * layer + 256
    assert (tmp_path / "work/pair/llama31_8b_instruct/model.safetensors.index.json").is_file()

    ops = record["ops"]  # every op type at the pair's shapes, stock and kernel, each a verdict
    assert ops["kernels"] == "ran"
    assert set(ops["linear"]) == {"64x256", "256x256", "512x256", "256x512", "2048x256"}  # heads cut to 2048 rows
    assert set(ops["rms_norm"]) == {"LlamaRMSNorm 256", "MistralRMSNorm 256"}
    assert set(ops["log_softmax"]) == {"128256", "32768"}
    for kind in ("linear", "rms_norm", "log_softmax"):
        for verdicts in ops[kind].values():
            for verdict in verdicts.values():
                assert verdict["keeps_bits"] == (verdict["differs_at"] == []), verdict
    assert ops["attention"]["4x1x64"]["kernel"] == {"keeps_bits": True, "differs_at": []}
    assert "CPU" in ops["attention"]["4x1x64"]["stock"]["error"]  # FlashAttention's varlen kernel: CUDA only
    assert ops["attention_ways"]["per_request"]["ms"] > 0

    runs = record["runs"]
    assert runs["adafuse_exact_b8_one_gpu"] == {"skipped": "no GPU visible: the members share one"}
    for name in RUNS:
        if name == "adafuse_exact_b8_one_gpu":
            continue
        run = runs[name]
        assert run["decode_seconds"] > 0 and run["wall_seconds"] > 0 and run["memory"] == {}, (name, run)
        if name.startswith("generate_"):
            assert run["examples"] == 3 and run["new_tokens"] > 0, run
            continue
        assert run["examples"] == PROMPTS[name][0], (name, run)
        assert set(run["devices"].values()) == {"cpu"}
        assert {p["backend"] for p in run["passes"].values()} == {"cpu-exact"}
        assert all(model["kv_peak_bytes"] > 0 for model in run["batching"].values()), (name, run["batching"])
    assert runs["adafuse_exact_b8"]["batch_invariant"] and not runs["adafuse_not_exact_b8"]["batch_invariant"]
    assert runs["adafuse_exact_b8"]["batching"]["llama31_8b_instruct"]["merged_passes"] > 0
    assert set(runs["single_llama_b8"]["passes"]) == {"llama31_8b_instruct"}  # `single` loads its member alone
    profile = runs["adafuse_profile_b8"]["profile"]  # a CPU has no kernels to launch
    assert profile["host_op_seconds"] > 0 and (profile["gpu_seconds"], profile["launches"]) == (0, 0)
    assert profile["per_pass"]["passes"] == sum(m["passes"] for m in runs["adafuse_profile_b8"]["batching"].values())

    same = record["identical"]  # exact batching on the CPU: batch size changes no text
    for pair in (
        ("adafuse_exact_b8", "adafuse_exact_b1"),
        ("adafuse_exact_b32", "adafuse_exact_b1"),
        (
            "single_llama_b8",
            "single_llama_b1",
        ),
    ):
        assert same["_vs_".join(pair)] == {"examples": 3, "texts": 3}, (pair, same["_vs_".join(pair)])
    assert same["gsm8k_adafuse_exact_b8_vs_gsm8k_adafuse_exact_b32"] == {"examples": 3, "texts": 3}
    assert same["adafuse_exact_b8_one_gpu_vs_adafuse_exact_b8"] is None
    assert all(isinstance(r, float) for name, r in record["ratios"].items() if "one_gpu" not in name), record["ratios"]
    assert record["probe_time"]["store_empty"] is None  # the CPU's backend reports no probe seconds
    assert record["goals"]["batch_8_texts_equal_batch_1_or_said_batch_dependent"]["met"] is True
    assert record["goals"]["gsm8k_b32_without_running_out_of_memory"]["met"] is True

    # docs/speed.md's block, once a GPU's record is committed: every run in it, every goal, the op report
    table = render_docs.RENDERERS["gpu-full"][1](record)
    assert "a dry run" in table and table.count("\n| linear |") == len(ops["linear"])
    assert all(f"| {render_docs.GPU_RUN_LABELS[name]} |" in table for name in RUNS)
    assert (
        "| batch 8's texts equal batch 1's, or the run says it is batch-dependent | 3/3; batch-invariant: yes | yes |"
        in table
    )
