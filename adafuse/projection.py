"""The vocabulary projection on the CPU, multiplied one block of the weight's rows at a time.

A model's last layer multiplies each position's hidden state by its output embeddings: 262,144 x 640
floats (671 MB) for Gemma-3. With a few rows of hidden states, MKL's GEMM reads that whole matrix from
memory again for every row or two. A block of 512 of its rows stays in the processor's cache while every
row is multiplied by it, so the matrix is read once. Each block is the same multiply over the same inner
dimension, so every logit keeps the bits of one multiply over the whole matrix with the same rows
(tests/engine/test_projection.py checks it on both bundled models' heads); only the time changes
(README: Speed).

Each block is multiplied in row tiles like every other linear layer (adafuse/invariance.py
`tiled_linear`): the rows are padded to whole tiles once, and every block's multiply is probed as its own
kernel. A blocked head is blocked for every number of rows, one included, so that a row's logits never
depend on how many rows its pass had (blocks of a different shape would be another kernel).

Heads where blocks cost more than they save keep one multiply (README: Speed, the figures): bfloat16
ones, whose CPU kernels were slower in blocks at every size measured, Gemma-3's real head included; and
heads with a narrow inner dimension (under `MIN_HIDDEN`: the tests' tiny models), where each block is
too little work to pay for its call. On any other device the layer is left alone: a GPU picks its
kernels by shape, and the tiles of adafuse/invariance.py already fix that shape.
"""

import functools

import torch

from adafuse.invariance import linear, multiply_in_tiles, one_call_is_tiled, only_live, pad_to_tiles

BLOCK_ROWS = 512
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
    return only_live(x, head.weight.shape[0], lambda flat: _blocked_rows(head, flat), pack=True)


def _blocked_rows(head: torch.nn.Linear, flat: torch.Tensor) -> torch.Tensor:
    rows = flat.shape[0]
    # block shape -> the rows padded to its tiles, and whether one call keeps their bits: every block of a
    # shape is one kernel (all but perhaps the last block share one), probed once, not once per block
    padded: dict[torch.Size, tuple[torch.Tensor, bool]] = {}
    outputs = []
    for w, b in _blocks(head):
        if w.shape not in padded:
            x = pad_to_tiles(flat, w, b)
            padded[w.shape] = x, one_call_is_tiled(w, b, x.shape[0])
        x, whole = padded[w.shape]
        outputs.append(linear(x, w, b) if whole else multiply_in_tiles(x, w, b))
    return torch.cat([out[:rows] for out in outputs], dim=-1)


def _blocks(head: torch.nn.Linear) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The head's row blocks (views of its weight and bias), made once for the weight it holds now."""
    weight, bias = head.weight, head.bias
    kept = getattr(head, "_adafuse_blocks", None)
    if kept is None or kept[0] is not weight or kept[1] is not bias:
        blocks = [
            (weight[i : i + BLOCK_ROWS], None if bias is None else bias[i : i + BLOCK_ROWS])
            for i in range(0, weight.shape[0], BLOCK_ROWS)
        ]
        kept = head._adafuse_blocks = (weight, bias, blocks)
    return kept[2]
