"""tools/gpu_full.py (`python -m tools.gpu_check --full`): the paper's pair at its real sizes on a GPU. Its dry
run runs every step on the CPU on the pair at hidden 256, the real vocabularies and tokenizers, so the
tool cannot rot between the rare calls on a GPU machine."""

import json
import subprocess
import sys
import time

import pytest
from transformers import StoppingCriteriaList, StopStringCriteria

from tests.support.paths import ROOT
from tools import gpu_full
from tools.bench_decode import task_requests

RUNS = ["generate_llama_b1", "generate_mistral_b1", *gpu_full.ENGINE_RUNS]


@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_records_it(shared_data, tmp_path):
    out = tmp_path / "gpu_full.json"
    command = ["-m", "tools.gpu_check", "--full", "--dry-run", "--data-dir", str(shared_data), "--out", str(out)]
    subprocess.run([sys.executable, *command], cwd=ROOT, check=True)
    record = json.loads(out.read_text())
    prompts = record["prompts"]
    assert record["build"]["llama31_8b_instruct"]["vocab"] == 128256
    assert record["build"]["mistral7b_instruct_v03"]["vocab"] == 32768
    assert "error" not in record["warm_up"], record["warm_up"]
    for name in RUNS:
        run = record[name]
        assert run.get("prompts") == prompts and run["decode_seconds"] > 0, (name, run)
        assert run["peak_memory_gb"] is None  # a CPU has no GPU memory to count
    exact, loose = record["adafuse_exact_b8"]["batching"], record["adafuse_not_exact_b8"]["batching"]
    assert {m["linear"] for m in exact.values()} == {"row_tiles"}
    assert {m["linear"] for m in loose.values()} == {"merged"}
    assert record["adafuse_exact_b8"]["merged_passes"] > 0 and record["adafuse_exact_b1"]["merged_passes"] == 0
    same, every = record["identical"], {"prompts": prompts, "of": prompts, "texts": prompts}
    for model in ("llama", "mistral"):
        assert same[f"single_{model}_b8_vs_b1"] == every | {"logprobs_bitwise": prompts}
    assert same["adafuse_exact_b8_vs_exact_b1"]["texts"] == prompts
    # every weight shape of both models multiplied, each with its probed tile
    assert {"128256x256", "32768x256", "256x256", "64x256", "512x256", "256x512"} == set(record["probes"])
    assert all(shape["tile_rows"] >= 1 for shape in record["probes"].values())
    assert all(isinstance(ratio, float) for ratio in record["ratios"].values()), record["ratios"]
    attention = record["attention"]  # at the pair's heads; FlashAttention's varlen kernel is CUDA's alone
    assert (attention["heads"], attention["kv_heads"], attention["head_dim"]) == (4, 1, 64)
    assert {type(attention["sdpa_padded"][v]) for v in ("equals_alone", "batch_invariant")} == {bool}
    assert "CUDA only" in attention["varlen"]["error"] and attention["per_request"]["ms"] > 0


def test_a_run_past_its_deadline_stops_and_says_how_far_it_got(shared_data):
    requests = task_requests("nq", 3, shared_data, 4)
    name = "mistral7b_instruct_v03"
    tokenizer, model = gpu_full.bare_model(name, gpu_full.DRY_RUN_SIZES, "cpu")
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer, ["\n"])])
    texts, figures = gpu_full.generate(tokenizer, model, stop, requests, "cpu", end=time.perf_counter())
    assert texts == {} and figures["cut"] == "stopped at the deadline after 0 of 3 prompts"
    ensemble = gpu_full.ensemble_of({name: (tokenizer, model)})
    done, figures = gpu_full.decode_run(ensemble, requests, "cpu", "single", 8, True, end=0.0, member=0)
    assert len(done) == 1 and figures["cut"] == "stopped at the deadline after 1 of 3 prompts"
    whole = {"decode_seconds": 1.0, "prompts": 3}
    ratios = gpu_full.ratios({run: whole for run in RUNS} | {"adafuse_not_exact_b8": whole | {"cut": figures["cut"]}})
    assert ratios.pop("adafuse_exact_b8_over_not_exact_b8") is None  # a cut run is in no ratio
    assert None not in ratios.values()
