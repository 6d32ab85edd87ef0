"""tools/gpu_check.py's dry run: every stage of the GPU check on this CPU (the paper's pair in shape at hidden 128,
its real vocabularies and tokenizers, written to disk in shards and decoded through run.py; the kernels under
Triton's interpreter), so that the check cannot rot between the rare calls on a GPU machine. What only a GPU can
fill in (memory, the probes' seconds, the kernels' bits and speed on hardware) is the GPU's. About 75 s on two
cores."""

import json
import subprocess
import sys

import pytest

from adafuse.backend.cuda import available
from tests.support.paths import ROOT
from tools import gpu_check, render_docs

STAGES = ["toolchain", "ops", "smoke", "timing"]


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_records_it_with_its_seconds(shared_data, tmp_path, require):
    require(available(), "triton")  # the op report's kernels, under the interpreter
    out = tmp_path / "gpu_check.json"
    command = ["-m", "tools.gpu_check", "--dry-run", "--data-dir", str(shared_data), "--out", str(out)]
    subprocess.run([sys.executable, *command, "--work", str(tmp_path / "work")], cwd=ROOT, check=True)
    record = json.loads(out.read_text())
    assert list(record) == ["check", "stages", *STAGES[:3], "layers", "timing", "identical", "ratios", "goals"]
    assert list(record["stages"]) == STAGES
    assert all(0 < s["seconds"] <= s["budget_seconds"] for s in record["stages"].values()), record["stages"]

    toolchain = record["toolchain"]  # this machine's, and one real launch, interpreted
    assert toolchain["problems"] == [] and toolchain["torch"] and toolchain["triton"] and toolchain["gpus"] == []
    assert toolchain["launch"]["interpreted"] and toolchain["launch"]["agrees"]

    ops = record["ops"]  # every op type at the pair's shapes, stock and kernel: where a row's bits differ, and ms
    assert ops["kernels_interpreted"]
    assert set(ops["linear"]) == {"32x128", "128x128", "256x128", "128x256", "1024x128"}  # heads cut to 1024 rows
    assert set(ops["rms_norm"]) == {"LlamaRMSNorm 128", "MistralRMSNorm 128"}
    assert set(ops["log_softmax"]) == {"128256", "32768"}
    for op in ("linear", "rms_norm", "log_softmax"):
        for found in ops[op].values():
            for way in found.values():
                assert way["keeps_bits"] == (way["differs_at"] == []) and way["ms"]["1"] > 0, way
    assert all(
        found["kernel"]["keeps_bits"] for op in ("linear", "rms_norm", "log_softmax") for found in ops[op].values()
    )
    assert ops["attention"]["4x1x32"]["kernel"]["keeps_bits"]
    assert "CPU" in ops["attention"]["4x1x32"]["stock"]["error"]  # FlashAttention's varlen kernel: CUDA only

    smoke, timing = record["smoke"], record["timing"]
    built = smoke["build"]["models"]  # written to disk at the smoke's layers, in the hub's shards
    assert {name: m["vocab"] for name, m in built.items()} == {
        "llama31_8b_instruct": 128256,
        "mistral7b_instruct_v03": 32768,
    }
    assert {m["layers"] for m in built.values()} == {1} and built["llama31_8b_instruct"]["files"] > 1
    layers = record["layers"]
    assert 1 <= layers["layers"] <= 2 and layers["why"] and layers["estimate"]["seconds"] > 0
    if layers["layers"] == 2:  # built again at the layers chosen
        assert {m["layers"] for m in timing["build"]["models"].values()} == {2}
    prompts = record["check"]["prompts"]
    for stage, runs in (("smoke", gpu_check.SMOKE), ("timing", gpu_check.TIMING)):
        for run in runs:
            found = record[stage][run.name]
            assert found["decode_seconds"] > 0 and found["memory"] == {}, (stage, run.name, found)
            assert found["examples"] == prompts[run.task]["limit"], (stage, run.name, found)
            if run.generate is None:
                assert found["batch_invariant"] and {p["backend"] for p in found["passes"].values()} == {"cpu-exact"}
    assert smoke["adafuse_exact_b8"]["batching"]["llama31_8b_instruct"]["merged_passes"] > 0
    assert set(timing["unite_b8"]["passes"]) == set(gpu_check.NAMES)

    two = {"examples": 2, "texts": 2}  # exact batching on the CPU: the batch size changes no text
    assert record["identical"] == {
        stage: {"adafuse_exact_b8_vs_adafuse_exact_b1": two} for stage in ("smoke", "timing")
    }
    assert all(isinstance(ratio, float) for ratio in record["ratios"].values()), record["ratios"]
    goals = record["goals"]
    assert goals["batch_8_texts_equal_batch_1_or_said_batch_dependent"]["met"] is True
    assert goals["adafuse_b8_at_most_1.1_unite_b8"]["ratio"] == record["ratios"]["adafuse_b8_over_unite_b8"]
    assert goals["gsm8k_b32_within_80_gb"] == {"peak_gb": None, "met": None, "why": "no GPU: nothing to measure"}

    # docs/speed.md's block, once a GPU's record is committed: every goal, every run, the op report
    block = render_docs.RENDERERS["gpu-check"][1](record)
    assert "a dry run" in block and block.count("\n| linear |") == len(ops["linear"])
    assert all(f"| timing: {render_docs.GPU_RUN_LABELS[run.name]} |" in block for run in gpu_check.TIMING)
    assert "| smoke: 2/2; timing: 2/2 | yes |" in block
