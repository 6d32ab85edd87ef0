"""DeePEn on the real bundled pair against a slow, plain implementation (oracles/deepen.py: no cache, every
distribution from a full forward pass, transfer rows written out densely, upstream's optimiser loop
over the whole vocabulary), plus either member as the main one, K = 3, the cache, stop rules.

The transfer matrices here keep 1024 anchors (`max_anchors`), so a fresh machine builds them in
seconds, and map each distribution's 512 most probable tokens (`support`), so the reference
can write its rows out densely; the decoding step is the same for any anchor count and support.
"""

import shutil
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from filelock import FileLock

import baselines.deepen_transfer as deepen_transfer
from adafuse.config import SingleConfig
from adafuse.errors import ConfigError
from baselines.deepen import DeepenConfig, main_index
from baselines.deepen_transfer import prepare
from baselines.vocab import vocabulary_of
from oracles.deepen import assert_deepen_agrees
from oracles.fast import decode
from oracles.token_reference import PARTIAL
from tests.support.members import clone
from tests.support.prompts import TOKEN_METHOD_CASES

pytestmark = pytest.mark.slow

ANCHORS, SUPPORT = 1024, 512


@pytest.mark.parametrize("prompt, stop, budget", TOKEN_METHOD_CASES)
def test_deepen_equals_the_plain_reference_with_smollm2_as_main(tiny, prompt, stop, budget):
    cfg = DeepenConfig(max_anchors=ANCHORS, support=SUPPORT, skip_agree=False)  # every step runs the ensemble step
    gen = assert_deepen_agrees(tiny.members, prompt, cfg, stop, budget)
    assert all(step.fused for step in gen.trace.steps if step.token not in tiny.members[0].tokenisation.eos_ids)
    assert PARTIAL not in gen.text


@pytest.mark.parametrize("prompt, stop, budget", [TOKEN_METHOD_CASES[1], TOKEN_METHOD_CASES[3]])
def test_deepen_equals_the_plain_reference_with_gemma_as_main(tiny, prompt, stop, budget):
    assert_deepen_agrees(
        tiny.members, prompt, DeepenConfig(main=1, max_anchors=ANCHORS, support=SUPPORT, skip_agree=False), stop, budget
    )


def test_agreeing_steps_are_skipped_and_the_rest_fused(tiny):
    cfg = DeepenConfig(max_anchors=ANCHORS, support=SUPPORT)
    gen = assert_deepen_agrees(tiny.members, "The sum of 128 and 256 is", cfg, [], 8)
    vocabs = [vocabulary_of(m) for m in tiny.members]
    fused = []
    for step in gen.trace.steps:
        texts = {v.texts[i] for v, i in zip(vocabs, step.argmax)}
        agree = len(texts) == 1 and None not in texts
        assert step.fused == (not agree and step.argmax[0] not in tiny.members[0].tokenisation.eos_ids)
        assert len(step.loss) == (cfg.steps if step.fused else 0)
        fused.append(step.fused)
    assert True in fused and False in fused


def test_three_members_with_a_clone_match_the_reference(tiny, smol):
    members = [*tiny.members, clone(smol)]
    cfg = DeepenConfig(max_anchors=ANCHORS, support=SUPPORT, skip_agree=False, weights=[0.25, 0.5, 0.25])
    gen = assert_deepen_agrees(members, "Question: Who wrote Hamlet?\nAnswer:", cfg, ["\n"], 8)
    assert gen.ids[0] == gen.ids[2] and len(gen.stats.forward_passes) == 3


def test_lr_zero_is_the_main_members_greedy_decoding(tiny):
    prompt = "Englisch: The old house is very small.\nDeutsch:"
    for main in (0, 1):
        gen = decode(
            tiny.members,
            prompt,
            DeepenConfig(main=main, lr=0, max_anchors=ANCHORS, support=SUPPORT),
            stop=["\n"],
            max_new_tokens=12,
        )
        alone = decode(tiny.members, prompt, SingleConfig(member=main), stop=["\n"], max_new_tokens=12)
        assert gen.text == alone.text


def test_budget_stop_string_and_eos(tiny, smol):
    cfg = DeepenConfig(max_anchors=ANCHORS, support=SUPPORT)
    gen = decode(tiny.members, "Once upon a time", cfg, max_new_tokens=5)
    assert gen.stats.stop_reason == "length" and max(gen.stats.tokens_generated) >= 5
    # Gemma as main: SmolLM2 alone ends this prompt at once with its eos.
    question = "Question: What is the capital of France?\nAnswer:"
    gen = decode(
        tiny.members,
        question,
        DeepenConfig(main=1, max_anchors=ANCHORS, support=SUPPORT),
        stop=["is"],
        max_new_tokens=30,
    )
    assert gen.stats.stop_reason == "stop" and "is" not in gen.text
    chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    gen = decode([smol, clone(smol)], chat, cfg, max_new_tokens=40)
    assert gen.stats.stop_reason == "eos" and "<|im_end|>" not in gen.text


def test_the_real_pair_reads_its_matrices_back_from_disk(tiny, smol, tmp_path, monkeypatch):
    monkeypatch.setattr(deepen_transfer, "_TRANSFERS", weakref.WeakKeyDictionary())
    cfg = DeepenConfig(max_anchors=256, cache_dir=str(tmp_path))
    built = prepare(tiny.members, cfg)
    (path,) = (tmp_path / "deepen").glob("*.safetensors")
    meta = deepen_transfer.read_metadata(path)
    assert meta["anchors"] == "256" and {meta[k] for k in meta if k.endswith(".name")} == {
        "smollm2_135m",
        "gemma3_270m",
    }
    monkeypatch.setattr(deepen_transfer, "_TRANSFERS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(
        deepen_transfer, "build_transfer", lambda *a, **k: pytest.fail("built again instead of reading")
    )
    read = prepare(tiny.members, cfg)
    assert all(torch.equal(a.slope, b.slope) and torch.equal(a.top_ids, b.top_ids) for a, b in zip(built, read))
    # Another set of models is another file (SmolLM2 with itself: its whole vocabulary is the anchors' pool).
    monkeypatch.undo()
    monkeypatch.setattr(deepen_transfer, "_TRANSFERS", weakref.WeakKeyDictionary())
    prepare([smol, clone(smol)], cfg)
    assert len(list((tmp_path / "deepen").glob("*.safetensors"))) == 2


def test_a_build_under_way_elsewhere_is_awaited_and_read_not_repeated(tiny, tmp_path, monkeypatch):
    """Whoever finds the matrices' lock held (another worker, another array job) waits for the file and
    reads it instead of building the same matrices beside it."""
    shared = DeepenConfig(max_anchors=ANCHORS, support=SUPPORT)  # the reference tests' matrices, in the cache
    built = prepare(tiny.members, shared)  # from memory or the cache; built once for every test that uses them
    key = deepen_transfer.cache_key([deepen_transfer.member_digest(m, vocabulary_of(m)) for m in tiny.members], shared)
    finished = deepen_transfer.transfer_path(shared, key)
    target = tmp_path / "deepen" / finished.name
    target.parent.mkdir()
    monkeypatch.setattr(deepen_transfer, "_TRANSFERS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(deepen_transfer, "build_transfer", lambda *a, **k: pytest.fail("built beside the lock holder"))
    with ThreadPoolExecutor(1) as pool, FileLock(target.with_suffix(".lock")):
        mine = DeepenConfig(max_anchors=ANCHORS, support=SUPPORT, cache_dir=str(tmp_path))
        waiting = pool.submit(prepare, tiny.members, mine)
        time.sleep(2)
        assert not waiting.done(), waiting.exception()
        shutil.copy(finished, target)  # what the lock holder leaves
    read = waiting.result(timeout=60)
    assert all(torch.equal(a.slope, b.slope) and torch.equal(a.top_ids, b.top_ids) for a, b in zip(built, read))


def test_a_main_member_that_does_not_exist_is_refused(tiny):
    with pytest.raises(ConfigError, match="main member 2 does not exist"):
        decode(tiny.members, "Hi", DeepenConfig(main=2), max_new_tokens=2)
    with pytest.raises(ConfigError, match="1 weights for 2 members"):
        decode(tiny.members, "Hi", DeepenConfig(weights=[1.0]), max_new_tokens=2)


def test_the_sentencepiece_member_can_be_named_as_the_main_one(tiny, smol):
    assert main_index("sentencepiece", tiny.members) == 1  # Gemma-3; SmolLM2 is byte-level BPE
    with pytest.raises(ConfigError, match="exactly one SentencePiece member"):
        main_index("sentencepiece", [smol, clone(smol)])
