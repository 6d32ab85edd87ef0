"""tools/attention_probe.py: the ways a merged pass's attention could run in one call compute each request's
attention (to within rounding: whether they keep its bits is what the probe measures on a device), in the packed
form the backend's probe takes too."""

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tools import attention_probe

SHAPES = [(1, 40), (3, 17), (2, 0), (4, 9)]  # (width, cached length), a prompt read from nothing among them


def requests(heads: int, kv_heads: int, head_dim: int):
    torch.manual_seed(0)
    queries = [torch.randn(1, heads, w, head_dim) for w, _ in SHAPES]
    keys = [torch.randn(1, kv_heads, w + n, head_dim) for w, n in SHAPES]
    values = [torch.randn(1, kv_heads, w + n, head_dim) for w, n in SHAPES]
    return queries, keys, values


def slow_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int) -> torch.Tensor:
    """Causal attention written out, in float64: query i sees keys 0 .. length + i. (width, heads, d)."""
    q, k, v = (x[0].double() for x in (q, k, v))
    k, v = (x.repeat_interleave(q.shape[0] // x.shape[0], dim=0) for x in (k, v))
    scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~attention_probe.causal_mask(q.shape[1], length, "cpu")[0], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1)


@pytest.mark.parametrize("heads, kv_heads", [(4, 1), (4, 4)])
def test_the_padded_call_is_each_requests_causal_attention(heads, kv_heads):
    queries, keys, values = requests(heads, kv_heads, 16)
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    outputs = attention_probe.padded_call(module, 16**-0.5, SHAPES, queries, keys, values, "cpu")
    alone_mask = attention_probe.engine_masks(heads, kv_heads, 16)
    for (width, length), q, k, v, out in zip(SHAPES, queries, keys, values, outputs, strict=True):
        assert out.shape == (width, heads, 16)
        torch.testing.assert_close(out.double(), slow_attention(q, k, v, length), atol=1e-5, rtol=1e-5)
        alone = sdpa_attention_forward(module, q, k, v, alone_mask(width, length, q), scaling=16**-0.5)[0][0]
        torch.testing.assert_close(out, alone)  # the engine's attention alone, up to the last bits


def test_the_probe_records_each_way_with_its_verdicts_and_an_unavailable_kernel_as_an_error():
    result = attention_probe.probe("cpu", torch.float32, 4, 2, 16, SHAPES)
    assert result["per_request"]["ms"] > 0 and result["shapes"] == [list(s) for s in SHAPES]
    padded = result["sdpa_padded"]
    assert isinstance(padded["equals_alone"], bool) and isinstance(padded["batch_invariant"], bool)
    assert padded["ms"] > 0 and 0 <= padded["max_difference"] < 1e-5  # the same attention, up to rounding
    for way in ("varlen", "varlen_one_split"):  # FlashAttention's kernel: CUDA only
        assert result[way] == {"error": "NotImplementedError: FlashAttention's varlen kernel runs on CUDA only"}


def test_the_packed_form_is_the_list_form_request_by_request():
    """`packed` hands a way each request's own tensors and packs its outputs back: the identity comes back whole."""
    q, k, v, cu_q, cu_k, scale, _, _, _ = attention_probe.packed_inputs(SHAPES, 4, 2, 16, torch.empty(0))
    seen = []

    def way(shapes, queries, keys, values, scale):
        seen.append(shapes)
        assert [x.shape for x in queries] == [(1, 4, w, 16) for w, _ in shapes]
        assert [x.shape for x in keys] == [(1, 2, w + n, 16) for w, n in shapes]
        return [x[0].transpose(0, 1) for x in queries]

    assert torch.equal(attention_probe.packed(way)(q, k, v, cu_q, cu_k, scale, None, 4, 44), q)
    assert seen == [SHAPES]
