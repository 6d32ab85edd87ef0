"""Ensemble.prompt_check (adafuse/text/prompt_check.py) on the bundled pair: the counts `prompt_lengths` gives, from its
own tokenizers; a prompt longer in bytes than a context can hold refused without any tokenizer reading it; and how
far each kind of normalizer may shrink a prompt before its tokens are counted."""

import pytest

from adafuse.errors import ContextLengthError
from adafuse.text.prompt_check import _shrink

PROMPTS = ["Question: What is the capital of France?\nAnswer:", "naïve café <bos> <|im_end|> 東京", "word " * 9000]


def test_it_counts_as_prompt_lengths_counts_with_tokenizers_of_its_own(tiny):
    check = tiny.prompt_check()
    for prompt in PROMPTS[:2]:
        assert check.lengths(prompt, 16) == tiny.prompt_lengths(prompt, 16)
    with pytest.raises(ContextLengthError, match="a prompt has 9001 tokens and decoding may add 124"):
        check.lengths(PROMPTS[2], 124)  # within the bytes' bound: counted, then refused as prompt_lengths refuses it
    mine = [m.tokenisation.tokenizer for m in check._models]
    assert not any(
        a is b or a.backend_tokenizer is b.backend_tokenizer
        for a, b in zip(mine, (m.tokenisation.tokenizer for m in tiny.members))
    )


def test_a_prompt_longer_in_bytes_than_a_context_can_hold_is_refused_unread(tiny, monkeypatch):
    check = tiny.prompt_check()
    smol, gemma = check.max_bytes(124)
    longest = max(len(b) for b in tiny.members[0].tokenisation.tokens.bytes if b)
    assert smol == (8192 - 124) * longest and gemma is not None and gemma > smol  # SmolLM2 bounds the pair
    for model in check._models:  # a tokenizer that reads the prompt fails the test
        monkeypatch.setattr(model.tokenisation, "prompt_ids", lambda *args: pytest.fail("the prompt was tokenized"))
    with pytest.raises(
        ContextLengthError, match=f"model 'smollm2_135m': a prompt of {smol + 1} bytes has more than 8068"
    ):
        check.lengths("x" * (smol + 1), 124)
    with pytest.raises(pytest.fail.Exception):  # one byte fewer: no bound says no, so it is counted
        check.lengths("x" * smol, 124)


@pytest.mark.parametrize(
    "normalizer, shrink",
    [
        (None, 1),  # byte-level BPE (SmolLM2, Llama 3, Qwen)
        ({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}, 1),  # SentencePiece's spaces (Gemma)
        ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                              {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}, 1),
        ({"type": "Replace", "pattern": {"String": "  "}, "content": " "}, 2),
        ({"type": "NFKC"}, 4),  # 𝐀 (4 bytes) becomes A
        ({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}, 16),
        ({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}, None),  # runs of spaces: no bound
        ({"type": "Replace", "pattern": {"String": "x"}, "content": ""}, None),
        ({"type": "Precompiled", "precompiled_charsmap": ""}, None),
        ({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Strip", "strip_left": True}]}, None),
    ],
)  # fmt: skip
def test_each_normalizer_shrinks_a_prompt_at_most_so_far(normalizer, shrink):
    assert _shrink(normalizer) == shrink
