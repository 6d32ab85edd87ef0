"""DeePEn's one-off preparation on small made-up members: the compressed transfer rows against the
dense softmax, the safetensors cache (read back, atomic, keyed by the models), the knob checks."""

import os
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

import baselines.deepen_transfer as deepen_transfer
from adafuse.errors import ConfigError
from adafuse.text.tokens import vocabulary_bytes
from baselines.deepen import DeepenConfig
from baselines.deepen_transfer import build_transfer, dense_transfer_rows, prepare, write_atomic
from tests.support.members import FakeTokenizer

PIECES_A = ["<eos>", "Ġthe", "Ġcat", "Ġsat", "Ġon", "Ġmat", "Ċ", "a", "b", "c", "Ġdog", "Ġran", "x", "y"]
PIECES_B = ["<eos>", "▁the", "▁cat", "▁sat", "▁on", "▁mat", "<0x0A>", "a", "b", "c", "▁bird", "z", "w"]


class FakeTokenisation:
    """What the preparation reads of a member's tokenisation: its vocabulary's bytes and control/eos ids."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces
        self.eos_ids = frozenset({0})
        self.control_ids = frozenset()

    def vocabulary_bytes(self):
        return vocabulary_bytes(FakeTokenizer(self.pieces), len(self.pieces))

    def encode_text(self, text: str) -> list[int]:
        return []


class FakeRunner:
    """What it reads of a member's weights: the logits' width and the input embeddings."""

    def __init__(self, vocab_size: int, weight: torch.Tensor):
        self.vocab_size = vocab_size
        self.weight = weight

    def input_embeddings(self) -> torch.Tensor:
        return self.weight


class FakeMember:
    """A member as the preparation reads it: a name, a tokenisation, a runner and a model object."""

    def __init__(self, name: str, pieces: list[str], seed: int, hidden: int = 8):
        self.name = name
        self.tokenisation = FakeTokenisation(pieces)
        weight = torch.randn(len(pieces), hidden, generator=torch.Generator().manual_seed(seed))
        self.runner = FakeRunner(len(pieces), weight)
        self.model = torch.nn.Module()  # the embeddings' digest is remembered per model object


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache directory and an empty in-process memo."""
    monkeypatch.setattr(deepen_transfer, "_TRANSFERS", weakref.WeakKeyDictionary())
    return DeepenConfig(cache_dir=str(tmp_path), row_top_k=2)


def test_compressed_rows_match_the_dense_softmax():
    emb = torch.randn(300, 16, generator=torch.Generator().manual_seed(0))
    anchors = torch.arange(0, 300, 3)
    stored, error = build_transfer(emb, anchors, temperature=100.0, row_top_k=4)
    dense = dense_transfer_rows(emb, anchors, torch.arange(300), 100.0)
    # DeePEn's rows written out: softmax(T * cosines to the anchors, each row of cosines L2-normalised)
    cos = F.normalize(emb, dim=-1) @ F.normalize(emb[anchors], dim=-1).T
    assert torch.allclose(dense, torch.softmax(100.0 * F.normalize(cos, dim=-1), dim=-1), atol=1e-6)
    transfer = deepen_transfer._transfer({f"t.{k}": v for k, v in stored.items()}, "t", emb)
    ours = transfer.dense_rows(torch.arange(300))
    l1 = (ours - dense).abs().sum(-1)
    assert torch.allclose(ours.sum(-1), torch.ones(300), atol=1e-5)  # every row still sums to 1
    assert torch.allclose(ours.gather(1, transfer.top_ids), dense.gather(1, transfer.top_ids), atol=1e-7)
    assert error["l1_mean"] == pytest.approx(l1.mean().item(), abs=1e-4)
    assert error["l1_max"] == pytest.approx(l1.max().item(), abs=1e-4)
    # How far the compressed rows may be from the dense ones (L1 between two distributions is at most 2):
    # measured 0.026 mean and 0.47 at worst with 4 exact entries per row of 100 anchors.
    assert l1.mean() < 0.05 and l1.max() < 0.6
    # Keeping more entries exactly shrinks the error: measured 9e-5 mean and 0.0052 at worst with 16.
    _, closer = build_transfer(emb, anchors, temperature=100.0, row_top_k=16)
    assert closer["l1_mean"] < 5e-4 and closer["l1_max"] < 0.01
    # The products the decoder uses equal the written-out rows.
    w = torch.rand(20)
    ids = torch.randperm(300)[:20]
    assert torch.allclose(transfer.rows(ids).to_anchors(w), w @ ours[ids], atol=1e-6)


def test_second_call_reads_the_safetensors_file_and_builds_nothing(fresh, monkeypatch):
    members = [FakeMember("a", PIECES_A, 1), FakeMember("b", PIECES_B, 2)]
    first = prepare(members, fresh)
    files = list(Path(fresh.cache_dir, "deepen").iterdir())
    assert sorted(f.suffix for f in files) == [".lock", ".safetensors"]  # the file and its build lock
    files = [f for f in files if f.suffix == ".safetensors"]
    assert files[0].read_bytes()[:1] != b"\x80"  # not a pickle
    with safe_open(str(files[0]), "pt") as f:  # a plain safetensors file, with its build report
        meta = f.metadata()
        assert meta["anchors"] == "9" and meta["format"] == deepen_transfer.FORMAT
        stored = (".anchors", ".offset", ".slope", ".top_ids", ".top_values", ".top_fix")
        assert all(key.endswith(stored) for key in f.keys())

    monkeypatch.setattr(deepen_transfer, "_TRANSFERS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(
        deepen_transfer, "build_transfer", lambda *a, **k: pytest.fail("built again instead of reading")
    )
    second = prepare(members, fresh)
    for x, y in zip(first, second):
        assert (
            torch.equal(x.offset, y.offset) and torch.equal(x.top_ids, y.top_ids) and torch.equal(x.anchors, y.anchors)
        )
    # anchors: the 9 texts both vocabularies hold (" the" ... "\n", "a", "b", "c"), in the same order for both
    texts_a = [deepen_transfer.vocabulary_of(members[0]).texts[i] for i in first[0].anchors.tolist()]
    texts_b = [deepen_transfer.vocabulary_of(members[1]).texts[i] for i in first[1].anchors.tolist()]
    assert texts_a == texts_b and "\n" in texts_a and " dog" not in texts_a


def test_the_key_changes_with_the_models_and_not_with_their_order(fresh):
    a, b = FakeMember("a", PIECES_A, 1), FakeMember("b", PIECES_B, 2)
    key = deepen_transfer.cache_key
    digests = [deepen_transfer.member_digest(m, deepen_transfer.vocabulary_of(m)) for m in (a, b)]
    assert key(digests, fresh) == key(digests[::-1], fresh)
    assert key(digests, fresh) == key(digests + digests[:1], fresh)  # a clone of a member adds nothing
    other = FakeMember("b", PIECES_B, 3)  # same vocabulary, other weights
    assert deepen_transfer.member_digest(other, deepen_transfer.vocabulary_of(other)) != digests[1]
    renamed = FakeMember("b", PIECES_B[:-1] + ["v"], 2)  # same weights, other vocabulary
    assert deepen_transfer.member_digest(renamed, deepen_transfer.vocabulary_of(renamed)) != digests[1]
    assert key(digests, fresh) != key(digests, DeepenConfig(cache_dir=fresh.cache_dir, row_top_k=3))
    prepare([a, b], fresh)
    prepare([a, other], fresh)
    assert len(list(Path(fresh.cache_dir, "deepen").glob("*.safetensors"))) == 2


def test_a_failed_write_leaves_nothing_and_a_good_one_renames_a_complete_file(tmp_path, monkeypatch):
    target = tmp_path / "deepen" / "key.safetensors"

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(deepen_transfer, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, {"x": torch.zeros(3)}, {})
    assert list(target.parent.iterdir()) == []
    monkeypatch.undo()

    seen = []
    real_replace = os.replace

    def spy(src, dst):
        with safe_open(src, "pt") as f:  # complete before it takes the final name
            seen.append((Path(src).parent, list(f.keys())))
        real_replace(src, dst)

    monkeypatch.setattr(deepen_transfer.os, "replace", spy)
    write_atomic(target, {"x": torch.zeros(3)}, {"k": "v"})
    assert seen == [(target.parent, ["x"])] and [p.name for p in target.parent.iterdir()] == [target.name]


@pytest.mark.parametrize(
    "knobs, message",
    [
        (dict(lr=-0.1), "lr must be >= 0"),
        (dict(lr=float("nan")), "lr must be >= 0"),
        (dict(steps=-1), "steps"),
        (dict(temperature=0.0), "temperature"),
        (dict(row_top_k=-1), "row_top_k"),
        (dict(support=0), "support"),
        (dict(max_anchors=1), "max_anchors"),
        (dict(main=-1), "main"),
        (dict(weights=[0.7, 0.7]), "weights"),
    ],
)
def test_settings_that_make_no_sense_are_refused(knobs, message):
    with pytest.raises(ConfigError, match=message):
        DeepenConfig(**knobs)


def test_a_pairs_matrices_live_no_longer_than_its_models(fresh):
    """A process that loads pair after pair (an in-process sweep) keeps only the loaded pairs' matrices:
    a Transfer holds its model's embeddings, whose storage is the weights'."""
    import gc

    members = [FakeMember("a", PIECES_A, 1), FakeMember("b", PIECES_B, 2)]
    first = prepare(members, fresh)
    assert prepare(members, fresh) == first  # remembered while the models live
    weights = [weakref.ref(m.runner.weight) for m in members]
    del members, first
    gc.collect()
    assert all(w() is None for w in weights)
    assert len(deepen_transfer._TRANSFERS) == 0
