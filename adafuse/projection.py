"""The vocabulary projection on the CPU, multiplied one block of the weight's rows at a time.

A model's last layer multiplies each position's hidden state by its output embeddings: 262,144 x 640
floats (671 MB) for Gemma-3. With a few rows of hidden states, MKL's GEMM reads that whole matrix from
memory again for every row or two. A block of 512 of its rows stays in the processor's cache while every
row is multiplied by it, so the matrix is read once. Each block is the same multiply over the same inner
dimension, so every logit keeps the bits of one F.linear over the whole matrix (tests/engine/
test_projection.py checks it on both bundled models' heads); only the time changes (README: Speed).

A single row has nothing to share and keeps F.linear; so do more than `MAX_ROWS` rows, where the
multiply is bound by arithmetic and the blocks' outputs would hold the logits twice. So do heads where
blocks cost more than they save (README: Speed, the figures): bfloat16 ones, whose CPU kernels were
slower in blocks at every size measured, Gemma-3's real head included; and heads with a narrow inner
dimension (under `MIN_HIDDEN`: the tests' tiny models), where each block is too little work to pay for
its call. On any other device the layer is left alone: a GPU picks its kernels by shape, so a block
could round differently.
"""

import functools

import torch
import torch.nn.functional as F

BLOCK_ROWS = 512
MAX_ROWS = 128
MIN_HIDDEN = 256


def block_output_projection(model) -> None:
    """Make the model's output embeddings multiply in blocks on the CPU (idempotent)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.weight.device.type != "cpu":
        return
    if head.weight.dtype != torch.float32 or head.in_features < MIN_HIDDEN:
        return
    if not getattr(head, "_adafuse_blocked", False):
        head.forward = functools.partial(_blocked, head)
        head._adafuse_blocked = True


def _blocked(head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if rows < 2 or rows > MAX_ROWS:
        return F.linear(x, head.weight, head.bias)
    weight, bias = head.weight, head.bias
    blocks = [
        F.linear(x, weight[i : i + BLOCK_ROWS], None if bias is None else bias[i : i + BLOCK_ROWS])
        for i in range(0, weight.shape[0], BLOCK_ROWS)
    ]
    return torch.cat(blocks, dim=-1)
