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

`python -m tools.gpu_check --full` records it for the paper's pair on the GPU (`ops.attention_ways`).
"""

import argparse
import inspect
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LlamaConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from adafuse.backend.attention import AloneMasks, Span
from tools.bench_decode import cpu_model

# (width, cached length) per request: a merged pass of decoding requests after 5-shot NQ prompts (about
# 700 tokens), proposals of a few tokens beside single steps, one request still reading a short prompt
SHAPES = [(1, 700), (3, 655), (2, 810), (4, 120), (1, 1030), (2, 513), (1, 64), (3, 744)]
PAPER_HEADS = {"heads": 32, "kv_heads": 8, "head_dim": 128}  # Llama-3.1-8B and Mistral-7B alike
DTYPES = ("bfloat16", "float16", "float32")
ERROR_CHARS = 160  # of a way's error kept in the record (torch's dispatch errors list every backend)


def probe(device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, shapes=SHAPES, repeats=20) -> dict:
    """Each way's verdicts and milliseconds per merged pass (median of `repeats`), on seeded random inputs."""
    generator = torch.Generator(device="cpu").manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    queries = [random(1, heads, width, head_dim) for width, _ in shapes]
    keys = [random(1, kv_heads, length + width, head_dim) for width, length in shapes]
    values = [random(1, kv_heads, length + width, head_dim) for width, length in shapes]
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    scale = head_dim**-0.5
    alone_mask = engine_masks(heads, kv_heads, head_dim)

    def per_request() -> list[torch.Tensor]:
        outputs = []
        for (width, length), q, k, v in zip(shapes, queries, keys, values, strict=True):
            mask = alone_mask(width, length, q)
            outputs.append(sdpa_attention_forward(module, q, k, v, mask, scaling=scale)[0][0])
        return outputs

    def sdpa_padded(which: list[int]) -> list[torch.Tensor]:
        return padded_call(module, scale, [shapes[i] for i in which], [queries[i] for i in which],
                           [keys[i] for i in which], [values[i] for i in which], device)  # fmt: skip

    def varlen(which: list[int], splits: int | None = None) -> list[torch.Tensor]:
        return varlen_call(scale, [shapes[i] for i in which], [queries[i] for i in which],
                           [keys[i] for i in which], [values[i] for i in which], splits)  # fmt: skip

    every = list(range(len(shapes)))
    alone = per_request()
    result = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "shapes": [list(shape) for shape in shapes],
        "per_request": {"ms": milliseconds(per_request, device, repeats)},
    }
    ways = {"sdpa_padded": sdpa_padded, "varlen": varlen, "varlen_one_split": lambda which: varlen(which, 1)}
    for name, call in ways.items():
        try:
            together = call(every)
        except (RuntimeError, NotImplementedError, ImportError) as err:  # e.g. varlen off CUDA
            result[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:ERROR_CHARS]}"}
            continue
        by_itself = [call([i])[0] for i in every]
        result[name] = {
            "equals_alone": same(together, alone),
            "batch_invariant": same(together, by_itself),
            "max_difference": largest_difference(together, alone),
            "ms": milliseconds(lambda call=call: call(every), device, repeats),
        }
    return result


def engine_masks(heads: int, kv_heads: int, head_dim: int) -> Callable:
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


def same(outputs: list[torch.Tensor], others: list[torch.Tensor]) -> bool:
    """Every request's output equal to the other's, bit for bit."""
    return all(torch.equal(a, b) for a, b in zip(outputs, others, strict=True))


def largest_difference(outputs: list[torch.Tensor], others: list[torch.Tensor]) -> float:
    """The largest absolute difference between two ways' outputs: rounding (a way that computes the same
    attention) or not (one that computes another, e.g. a causal window aligned elsewhere)."""
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(outputs, others, strict=True))


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


def milliseconds(run: Callable, device, repeats: int) -> float:
    """Median wall milliseconds of `run()`, the device synchronised around each, after one untimed call."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    run()
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        run()
        sync()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


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
