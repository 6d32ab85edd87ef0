"""Members and passes as the tests drive them (a decode through the method seam is oracles/fast.py's): one pass run by
the member's backend as the engine runs it (`pass_alone`, `pass_merged`), member stand-ins (a narrowed sliding window,
the real tokenizers over tiny random weights), and a hand-made tokenizer."""

import contextlib
import copy

import torch
from transformers import AutoModelForCausalLM

from adafuse.backend import ALONE, MERGED, PROMPT, Execution, Pass, Read
from adafuse.member.member import Member

WINDOW = 16  # Gemma-3's sliding window in conftest's `narrow` and `tiny_shaped` (the real model's: 512)


def clone(member: Member) -> Member:
    """A second member over the same weights and tokenizer, with its own context and cache."""
    return member.clone()


def pass_alone(member: Member, cache, input_ids: torch.Tensor, last_only=False, lengths=None, exact=True):
    """One read in a pass of its own through the member's backend, as the engine runs it: its float32 logits
    (adafuse/backend/interface.py `Read` for their shape). The cache grows by the ids."""
    read = Read(cache, input_ids, lengths, last_only)
    if not cache.get_seq_length():
        kind = PROMPT
    else:
        kind = MERGED if member.runner.splits_attention else ALONE
    (ran,) = member.runner.backend.execute([Pass(kind, member.runner.prepared, (read,))], Execution(exact))
    return ran.results[0]


def pass_merged(member: Member, caches: list, inputs: list, lengths=None, last_only=None, exact=True) -> list:
    """Several reads to the member's weights in one merged pass (adafuse/backend/split_pass.py): each one's
    logits, as `pass_alone` gives them."""
    lengths = lengths or [None] * len(inputs)
    last_only = last_only or [False] * len(inputs)
    reads = tuple(Read(c, x, n, last) for c, x, n, last in zip(caches, inputs, lengths, last_only))
    (ran,) = member.runner.backend.execute([Pass(MERGED, member.runner.prepared, reads)], Execution(exact))
    return ran.results


@contextlib.contextmanager
def long_reads_stopped(members, positions: int = 1000):
    """Inside the block, a pass of `positions` or more through any member's body is recorded (the list yielded)
    and stopped with an AssertionError: a test that a long prompt is refused before any model reads it gets
    its answer at once, not after minutes of reading."""
    reads: list[str] = []

    def stop(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] >= positions:
            reads.append(f"{module.__class__.__name__} read {ids.shape[-1]} tokens")
            raise AssertionError(reads[-1])

    hooks = [m.model.get_decoder().register_forward_pre_hook(stop, with_kwargs=True) for m in members]
    try:
        yield reads
    finally:
        for hook in hooks:
            hook.remove()


def narrow_window(member: Member, window: int) -> Member:
    """The member's model with its sliding window narrowed to `window` tokens, over the same weights.

    Gemma-3 attends through a 512-token window on 5 of 6 layers; crossing it takes a prompt of more than
    512 tokens, and every cache-free reference pass re-reads all of them. With the window narrowed, a
    short prompt (and the generation itself) crosses it: the same code (masks, cache, cut-backs past the
    window) on sequences a tenth as long. A member of its own, not a clone: clones share their prompt
    cache, which holds the full-window model's keys and values."""
    model = member.model
    config = model.config.get_text_config()
    if not getattr(config, "sliding_window", None):
        raise ValueError(f"model {member.name!r} has no sliding window to narrow")
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    narrow = copy.deepcopy(model, shared)  # new modules and config; the weights are the same tensors
    narrow.config.get_text_config().sliding_window = window
    for module in narrow.modules():
        if getattr(module, "sliding_window", None):  # set on each sliding layer's attention from the config
            module.sliding_window = window
    return Member(
        f"{member.name}_window{window}", member.tokenisation.tokenizer, narrow, member.tokenisation.chat_template
    )


# The sizes of `in_shape`'s stand-ins, and the spread of their logits: as the paper's pair in shape
# (tools/make_paper_pair.py TINY, LOGIT_STD), so that some greedy steps are confident and some are not.
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16}
LOGIT_STD = 16.0


def in_shape(member: Member, seed: int, layers: int, kv_heads: int, **config) -> Member:
    """The member's tokenizer, architecture, special ids and eos set, with tiny seeded random weights.

    The decoder's bookkeeping sees the real vocabulary and its text (byte-level BPE, SentencePiece with
    byte fallback), at a small fraction of a real forward pass; the text is meaningless and varied."""
    shape = copy.deepcopy(member.model.config)
    # Untied: scaled as below, a head tied to the input embeddings makes a random model repeat its last token.
    for key, value in {
        **SHAPE,
        "tie_word_embeddings": False,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        **config,
    }.items():
        setattr(shape, key, value)
    if getattr(shape, "layer_types", None) is not None and len(shape.layer_types) != layers:
        raise ValueError(f"{member.name}: give the {layers} layers' layer_types")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(shape, dtype=torch.float32).eval()
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head.copy_(
            torch.randn(head.shape, generator=torch.Generator().manual_seed(seed)) * LOGIT_STD / shape.hidden_size**0.5
        )
    model.generation_config = copy.deepcopy(member.model.generation_config)
    return Member(f"{member.name}_in_shape", member.tokenisation.tokenizer, model, member.tokenisation.chat_template)


class FakeAdded:
    def __init__(self, content: str):
        self.content = content


class FakeTokenizer:
    """Just what adafuse.text.tokens.vocabulary_bytes reads: get_vocab() and added_tokens_decoder."""

    def __init__(self, pieces: list[str], added: dict[int, str] | None = None):
        self.pieces = {p: i for i, p in enumerate(pieces)}
        self.added_tokens_decoder = {i: FakeAdded(c) for i, c in (added or {}).items()}

    def get_vocab(self):
        return dict(self.pieces)
