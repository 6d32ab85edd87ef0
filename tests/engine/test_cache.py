"""KV-cache invariants of the member wrapper, checked against cache-free forward passes."""

import pytest
import torch

from adafuse import AdaFuseConfig
from adafuse.decode import Candidate, generate, score_foreign

from . import reference
from .helpers import clone

pytestmark = pytest.mark.slow


def full_next_logprobs(member, ids):
    return reference.RefModel(member).next_logprobs(ids)


def test_fork_extend_commit_match_full_forward(tiny):
    for member in tiny.members:
        m = clone(member)
        m.start("The quick brown fox")
        assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
        rows = m.fork(3)
        firsts = m.logprobs.topk(3).indices.tolist()
        rows.extend([[firsts[0]], [firsts[1]], [firsts[2]]])
        rows.extend([[7], [], [9]])  # row 1 stops early and is padded
        for i in range(3):
            assert torch.allclose(rows.last[i], full_next_logprobs(m, rows.prefix + rows.tokens[i]), atol=1e-4)
        m.commit(rows, 1)
        m.check_invariant()
        assert m.ids[-1] == firsts[1]
        m.feed([11, 12])
        m.check_invariant()
        assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
        with pytest.raises(AssertionError, match="stopped early"):
            rows.extend([[1], [2], [3]])


def test_rollback_past_the_sliding_window(tiny, shared_data, gemma):
    """Gemma 3 attends through a 512-token window; rolling back past it must still be exact."""
    m = clone(gemma)
    prompt = (shared_data / "adafuse_local_datasets/GSM/gsm_prompt.txt").read_text()
    m.start(prompt)
    assert len(m.ids) > 2 * 512
    context = list(m.ids)
    rows = m.fork(2)
    rows.extend([[100, 200, 300], [400, 500, 600]])
    m.commit(rows, 0)
    m.start(prompt[:-40])  # a shorter prompt: the cache is cut back inside the prompt
    m.check_invariant()
    assert m.ids == m.encode(prompt[:-40])
    assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
    m.start(prompt)
    assert m.ids == context
    assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)


def test_the_shared_few_shot_prefix_is_read_once(tiny, shared_data):
    nq = (shared_data / "adafuse_local_datasets/NaturalQuestions/dev/nq_prompt.txt").read_text()
    for member in tiny.members:
        m = clone(member)
        m.start(nq + "\n\nQuestion: who is the president\nAnswer:")
        first = m.tokens_fed
        m.reset_counters()
        m.start(nq + "\n\nQuestion: where is the eiffel tower\nAnswer:")
        question = len(m.ids) - len(m.encode(nq))
        assert m.tokens_fed <= question + 2 < first / 4
        assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)


def test_retokenised_candidate_cuts_the_context_back_where_the_boundary_merges(gemma):
    """Gemma encodes "\\n\\n" as one token: a candidate "\\nThe" after a context ending in "\\n" re-tokenises
    across the boundary, so the context is cut back and the merged token is scored as part of the candidate."""
    m = clone(gemma)
    prompt = "Here is a list:\n"
    m.start(prompt)
    candidate = Candidate("\nThe", False, 1)
    ((score, (rows, row)),) = score_foreign(m, prompt, [candidate])
    encoded = m.encode(prompt + "\nThe")
    assert score.base < len(m.ids)  # the trailing "\n" token merged into "\n\n"
    assert encoded[: score.base] == m.ids[: score.base] and score.ids == encoded[score.base :]
    expected = reference.nll(reference.RefModel(m), m.ids[: score.base], score.ids, False)
    assert score.nll == pytest.approx(expected, abs=1e-4)
    m.commit(rows, row)
    m.check_invariant()
    assert m.ids == encoded
    assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)


def test_cache_length_equals_context_after_every_decode(tiny):
    for prompt in ["Question: what is the tallest mountain?\nAnswer:", "Once upon a time,"]:
        generate(tiny.members, prompt, AdaFuseConfig(), stop=["\n"], max_new_tokens=12)
        for m in tiny.members:
            m.check_invariant()
            assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
