"""Could a merged pass run its attention in one call and keep every request's bits? A probe, per device.

    python -m tools.attention_probe                       # this machine's device, the paper pair's heads
    python -m tools.attention_probe --dtypes float32 --out results/bench/attention_cpu.json

An exact merged pass (adafuse/backend/split_pass.py) calls the model's attention once per request and layer, so that
each request attends exactly as in its pass alone; on a GPU those calls are host time (a merged pass of 8
requests through 32 layers makes 256). One call would do, where a kernel computes each request on its own
whatever shares the call. This probe measures, on random queries, keys and values of a merged pass's shapes
(requests of different widths after caches of different lengths, grouped-query heads), each request's
output of one call against its output alone, bit for bit, and the time of each way:

- `per_request`: transformers' SDPA attention called per request, with the mask the engine gives its pass
  alone (`engine_masks`): what the engine does, and the bits every output has today;
- `sdpa_padded`: one SDPA call over the requests right-padded to the widest and longest, with a boolean
  mask. `equals_alone`: each request's rows equal `per_request`'s (one call would change no output).
  `batch_invariant`: they equal the same padded call over the request by itself, at its own length (one
  call would be exact if passes alone went through it too, a change of every output's bits);
  `max_difference`: the largest difference from `per_request`, rounding if the way computes the same thing;
- `varlen`: FlashAttention's variable-length kernel (`torch.nn.attention.varlen.varlen_attn`, CUDA only)
  over the requests packed end to end, its causal window aligned to each request's last key; the same two
  verdicts, `batch_invariant` against the kernel over the request by itself. `varlen_one_split`: the same
  with the key/value sequence never split across thread blocks (`num_splits=1`, torch >= 2.13), which its
  documentation says makes a sequence's bits independent of the batch.

The verdicts and times are the CUDA backend's own probe's (adafuse/backend/cuda/choice.py `requests_alone`, each
way in its packed form): a request among the first 1 to 8 in one call against the same call over it alone.
"""

import argparse
import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LlamaConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from adafuse.backend.attention import AloneMasks, Span
from adafuse.backend.cuda.choice import requests_alone
from tools.bench_decode import cpu_model

# (width, cached length) per request: a merged pass of decoding requests after 5-shot NQ prompts (about
# 700 tokens), proposals of a few tokens beside single steps, one request still reading a short prompt
SHAPES = [(1, 700), (3, 655), (2, 810), (4, 120), (1, 1030), (2, 513), (1, 64), (3, 744)]
PAPER_HEADS = {"heads": 32, "kv_heads": 8, "head_dim": 128}  # Llama-3.1-8B and Mistral-7B alike
DTYPES = ("bfloat16", "float16", "float32")
ERROR_CHARS = 160  # of a way's error kept in the record (torch's dispatch errors list every backend)


def probe(device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, shapes=SHAPES) -> dict:
    """Each way's verdicts and milliseconds per merged pass of `shapes` (`requests_alone`'s timing), and how its
    outputs compare with the engine's per request on the same seeded random inputs."""
    like = torch.empty(0, dtype=dtype, device=device)
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    alone_mask = engine_masks(heads, kv_heads, head_dim)

    def per_request(shapes, queries, keys, values, scale) -> list[torch.Tensor]:
        return [
            sdpa_attention_forward(module, q, k, v, alone_mask(width, length, q), scaling=scale)[0][0]
            for (width, length), q, k, v in zip(shapes, queries, keys, values, strict=True)
        ]

    ways = {
        "sdpa_padded": lambda shapes, *qkv, scale: padded_call(module, scale, shapes, *qkv, device),
        "varlen": lambda shapes, *qkv, scale: varlen_call(scale, shapes, *qkv),
        "varlen_one_split": lambda shapes, *qkv, scale: varlen_call(scale, shapes, *qkv, splits=1),
    }
    everyone = len(shapes)

    def alone(way) -> object:  # a request among the first 1 to 8 against the same call over it alone, and ms
        at = {"counts": range(1, everyone + 1), "timed": (everyone,), "shapes": shapes}
        return requests_alone(packed(way), heads, kv_heads, head_dim, like, **at)

    inputs = packed_inputs(shapes, heads, kv_heads, head_dim, like)
    reference = packed(per_request)(*inputs)
    result = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "shapes": [list(shape) for shape in shapes],
        "per_request": {"ms": alone(per_request).ms[everyone]},
    }
    for name, way in ways.items():
        call = packed(lambda shapes, q, k, v, scale, way=way: way(shapes, q, k, v, scale=scale))
        try:
            together = call(*inputs)
            found = alone(lambda shapes, q, k, v, scale, way=way: way(shapes, q, k, v, scale=scale))
        except (RuntimeError, NotImplementedError, ImportError) as err:  # e.g. varlen off CUDA
            result[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:ERROR_CHARS]}"}
            continue
        result[name] = {
            "equals_alone": torch.equal(together, reference),
            "batch_invariant": found.keeps_bits,
            "max_difference": (together.float() - reference.float()).abs().max().item(),
            "ms": found.ms[everyone],
        }
    return result


def packed(way):
    """`way(shapes, queries, keys, values, scale)`, over each request's (1, heads, n, d) tensors, in the packed form
    the backend's attention and its probe take: `attend(q, k, v, cu_q, cu_k, scale, window, max_q, max_k)`."""

    def attend(q, k, v, cu_q, cu_k, scale, window, max_q, max_k):
        widths, spans = cu_q.diff().tolist(), cu_k.diff().tolist()
        queries = [x.transpose(0, 1)[None] for x in q.split(widths)]
        keys, values = ([x.transpose(0, 1)[None] for x in t.split(spans)] for t in (k, v))
        shapes = [(w, n - w) for w, n in zip(widths, spans, strict=True)]
        return torch.cat(way(shapes, queries, keys, values, scale))

    return attend


def packed_inputs(shapes, heads: int, kv_heads: int, head_dim: int, like: torch.Tensor) -> tuple:
    """Seeded random queries, keys and values of `shapes`, packed end to end: `attend`'s arguments."""
    generator = torch.Generator(device="cpu").manual_seed(0)

    def random(n: int, h: int) -> torch.Tensor:
        return torch.randn(n, h, head_dim, generator=generator).to(like)

    q = torch.cat([random(width, heads) for width, _ in shapes])
    k, v = (torch.cat([random(width + length, kv_heads) for width, length in shapes]) for _ in range(2))
    cu_q, cu_k = (
        torch.tensor([0, *lengths], device=like.device).cumsum(0).to(torch.int32)
        for lengths in ([w for w, _ in shapes], [w + n for w, n in shapes])
    )
    return q, k, v, cu_q, cu_k, head_dim**-0.5, None, max(w for w, _ in shapes), max(w + n for w, n in shapes)


def engine_masks(heads: int, kv_heads: int, head_dim: int):
    """`mask(width, length, query)`: the mask the engine gives a request's attention in its pass alone
    (adafuse/backend/attention.py `AloneMasks`, transformers' own mask functions: none where SDPA's causal flag
    does), for a full-attention model of these heads."""
    config = LlamaConfig(
        hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
        num_hidden_layers=1, vocab_size=1, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    masks = AloneMasks()

    def mask(width: int, length: int, query: torch.Tensor) -> torch.Tensor | None:
        return masks.get(config, None, Span(rows=slice(0, 1), length=length, width=width), query)

    return mask


def causal_mask(width: int, length: int, device) -> torch.Tensor:
    """(1, 1, width, length + width): query i (at position length + i) sees keys 0 .. length + i."""
    return (torch.arange(length + width, device=device) <= torch.arange(width, device=device)[:, None] + length)[
        None, None
    ]


def padded_call(module, scale: float, shapes, queries, keys, values, device) -> list[torch.Tensor]:
    """One SDPA call over the requests right-padded to the widest and the longest: each request's
    (heads, width, head_dim) output. A padded query row attends to key 0 (its output is dropped)."""
    rows, widest, longest = len(shapes), max(w for w, _ in shapes), max(w + n for w, n in shapes)
    q = queries[0].new_zeros(rows, queries[0].shape[1], widest, queries[0].shape[3])
    k = keys[0].new_zeros(rows, keys[0].shape[1], longest, keys[0].shape[3])
    v = torch.zeros_like(k)
    mask = torch.zeros(rows, 1, widest, longest, dtype=torch.bool, device=device)
    for i, ((width, length), qi, ki, vi) in enumerate(zip(shapes, queries, keys, values, strict=True)):
        q[i, :, :width], k[i, :, : length + width], v[i, :, : length + width] = qi[0], ki[0], vi[0]
        mask[i, 0, :width, : length + width] = causal_mask(width, length, device)[0, 0]
        mask[i, 0, width:, 0] = True
    out = sdpa_attention_forward(module, q, k, v, mask, scaling=scale)[0]  # (rows, widest, heads, head_dim)
    return [out[i, :width] for i, (width, _) in enumerate(shapes)]


def varlen_call(scale: float, shapes, queries, keys, values, splits: int | None = None) -> list[torch.Tensor]:
    """FlashAttention's variable-length kernel over the requests packed end to end, causal with each request's
    queries aligned to its last keys (window (-1, 0)), the key/value sequence split in `splits` parts (None:
    the kernel's choice, which depends on the longest request): each request's (width, heads, head_dim) output.
    A torch without grouped-query heads in the kernel (2.11) gets the key/value heads repeated."""
    from torch.nn.attention.varlen import varlen_attn  # torch >= 2.11

    if queries[0].device.type != "cuda":
        raise NotImplementedError("FlashAttention's varlen kernel runs on CUDA only")

    takes = inspect.signature(varlen_attn).parameters
    options = {"enable_gqa": True} if "enable_gqa" in takes else {}
    if splits is not None:
        if "num_splits" not in takes:
            raise NotImplementedError("this torch's varlen_attn has no num_splits")
        options["num_splits"] = splits
    groups = 1 if options.get("enable_gqa") else queries[0].shape[1] // keys[0].shape[1]

    def packed(parts: list[torch.Tensor]) -> torch.Tensor:  # (1, heads, n, d) each -> (sum n, heads, d)
        return torch.cat([p[0].transpose(0, 1) for p in parts])

    def starts(lengths: list[int]) -> torch.Tensor:
        return torch.tensor([0, *lengths], device=queries[0].device, dtype=torch.int32).cumsum(0, dtype=torch.int32)

    widths, spans = [w for w, _ in shapes], [w + n for w, n in shapes]
    k, v = (packed(x).repeat_interleave(groups, dim=1) for x in (keys, values))
    out = varlen_attn(
        packed(queries), k, v, starts(widths), starts(spans), max(widths), max(spans),
        scale=scale, window_size=(-1, 0), **options,
    )  # fmt: skip
    return list(out.split(widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=DTYPES)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args()
    result = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "dtypes": {dtype: probe(args.device, getattr(torch, dtype), **PAPER_HEADS) for dtype in args.dtypes},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
