"""Kernel probe verdicts on disk (adafuse/backend/probe_store.py, owned by the backend): a second process in the
same environment reads what the first probed and gets the same bits without probing; another environment, a
damaged line, two verdicts for one key or a store that cannot be written each fall back to probing."""

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from adafuse.backend.probe_store import ProbeStore, Verdicts, store_path

# One process multiplies rows of a fixed weight through a row-tiled layer (adafuse/backend/cpu/tiles.py), counting the
# probe inputs it builds; with PROBE_FAILS set, building one raises, so every verdict must come from the store.
MULTIPLY = """
import json, os, sys, torch
from adafuse.backend import backend_for
from adafuse.backend.cpu import tiles
if os.environ.get("PROBE_FAILS"):
    def refuse(*args, **kwargs):
        raise AssertionError("probed although the store holds the verdict")
    tiles.probe_input = refuse
probes = backend_for(torch.device("cpu")).probes
layer = torch.nn.Linear(320, 96, bias=False)
layer.weight.data = torch.randn(96, 320, generator=torch.Generator().manual_seed(0))
layer.__class__ = tiles.TiledLinear
layer.kernels = probes
x = torch.randn(9, 320, generator=torch.Generator().manual_seed(1))
with torch.inference_mode():
    out = layer(x)
print(json.dumps({"tile": tiles.tile_rows(probes, layer.weight, None), "out": out.flatten().tolist()}))
"""


@pytest.fixture
def fresh_store(tmp_path, monkeypatch):
    """A store in a folder of its own, as this process's environment names it."""
    monkeypatch.setenv("ADAFUSE_PROBE_STORE", str(tmp_path / "store"))
    return tmp_path / "store"


def run_multiply(store, fails: bool) -> dict:
    env = {**os.environ, "ADAFUSE_PROBE_STORE": str(store), "OMP_NUM_THREADS": "1"}
    if fails:
        env["PROBE_FAILS"] = "1"
    done = subprocess.run([sys.executable, "-c", MULTIPLY], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_second_process_reads_the_verdicts_and_gets_the_same_bits(tmp_path):
    store = tmp_path / "store"
    first = run_multiply(store, fails=False)
    (written,) = store.glob("*.jsonl")
    tables = {json.loads(line)["table"] for line in written.read_text().splitlines()}
    assert "tile_rows" in tables and ("one_call" in tables) == (first["tile"] < 9)  # 9 rows past one tile: probed
    second = run_multiply(store, fails=True)
    assert second == first


def test_verdicts_are_recorded_once_and_served_from_the_store(fresh_store):
    key = (torch.device("cpu"), torch.float32, (8, 4), (4, 1), False, 2)
    probes = []
    assert Verdicts("one_call", ProbeStore.for_environment()).get_or_probe(key, lambda: probes.append(1) or True)
    later = ProbeStore.for_environment()  # as the next process: only the file remains
    assert Verdicts("one_call", later).get_or_probe(key, lambda: probes.append(2) or False) is True
    assert Verdicts("fewer_threads", later).get_or_probe(key, lambda: probes.append(3) or False) is False
    assert probes == [1, 3]


def test_another_kernel_environment_is_another_store(fresh_store, monkeypatch):
    here = store_path()
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")  # MKL's reproducibility mode changes its kernels
    assert store_path() != here and store_path().parent == here.parent


def test_unreadable_lines_and_conflicting_verdicts_are_probed_again(fresh_store, caplog):
    good, torn, twice = ("k", 1), ("k", 2), ("k", 3)
    path = store_path()
    path.parent.mkdir(parents=True)
    lines = [
        {"table": "one_call", "key": repr(good), "verdict": True},
        {"table": "one_call", "key": repr(twice), "verdict": True},
        {"table": "one_call", "key": repr(twice), "verdict": False},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"table": "one_call", "key": "' + "\n")
    probed = []
    table = Verdicts("one_call", ProbeStore.for_environment())
    with caplog.at_level(logging.WARNING, logger="adafuse.backend.probe_store"):
        for key in (good, torn, twice):
            table.get_or_probe(key, lambda key=key: probed.append(key) or False)
    assert probed == [torn, twice]
    assert "1 unreadable lines skipped" in caplog.text and "1 keys hold two verdicts" in caplog.text


def test_a_store_that_cannot_be_written_leaves_the_verdicts_to_the_process(tmp_path, monkeypatch, caplog):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("ADAFUSE_PROBE_STORE", str(tmp_path / "a_file" / "store"))  # a folder under a file
    table = Verdicts("one_call", ProbeStore.for_environment())
    with caplog.at_level(logging.WARNING, logger="adafuse.backend.probe_store"):
        assert table.get_or_probe(("k",), lambda: True) is True
        assert table.get_or_probe(("j",), lambda: False) is False
    assert caplog.text.count("cannot be written") == 1


def test_the_store_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAFUSE_PROBE_STORE", "off")
    monkeypatch.setenv("ADAFUSE_CACHE", str(tmp_path))
    assert store_path() is None
    assert Verdicts("one_call", ProbeStore.for_environment()).get_or_probe(("k",), lambda: True) is True
    assert not any(tmp_path.rglob("*.jsonl"))
