"""Vocabulary normalisation for the token-level baselines (UniTE, DeePEn): every id -> the text it stands for.

Token-level ensembles compare tokens of different tokenizers by their text (research notes
../shared/research/baselines.md §7.2). Each id's bytes come from adafuse/text/tokens.py, which reads
byte-level BPE and SentencePiece vocabularies (the type detected from the vocabulary itself, never
from a model's name); added tokens (Gemma's newline runs, `<|im_end|>`) stand for their literal content.

A token's text is None when it cannot become shared text on its own:
- a control token (spec §2: specials and added non-whitespace tokens, minus eos) or an eos id;
- a token whose bytes are not whole UTF-8 characters (a byte-fallback `<0xC3>`, SmolLM2's `ĠÃ`
  that starts " ü"): its text exists only together with the next token;
- a token with empty text, and ids past the tokenizer's vocabulary (padding rows of the logits).

Newline is the real "\\n" (the official UniTE code uses the two characters "/n"). The text of a
token read after a prompt is its vocabulary text: neither Gemma 3 nor byte-level BPE adds or strips
a leading space in context (a tokenizer that prepends a dummy prefix at the start of a text, like
Llama 2's, only does so at position 0, which a prompt always occupies).
"""

import hashlib
import json
import weakref
from dataclasses import dataclass, field
from functools import cached_property

import torch

from adafuse.errors import ConfigError


@dataclass
class Vocabulary:
    """One tokenizer's ids as text. `texts[i]` is id i's text or None (see the module docstring)."""

    kind: str  # BYTE_LEVEL or SENTENCEPIECE
    texts: list[str | None]  # one per logit column
    partial: frozenset[int]  # ids whose bytes are not whole characters (they may start or end one)
    index: dict[str, list[int]] = field(default_factory=dict)  # text -> ids that stand for it, ascending
    bare_space: frozenset[int] = frozenset()  # ids whose text is exactly " "

    @classmethod
    def build(cls, kind: str, raws: list[bytes | None], excluded=frozenset()) -> "Vocabulary":
        """Normalise a vocabulary of type `kind` from each logit column's bytes (adafuse/text/tokens.py
        `vocabulary_bytes`); `excluded` are the ids that are never text (control and eos ids)."""
        texts: list[str | None] = [None] * len(raws)
        partial = set()
        for i, raw in enumerate(raws):
            if i in excluded or not raw:
                continue
            try:
                texts[i] = raw.decode("utf-8")
            except UnicodeDecodeError:
                partial.add(i)
        index: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            if text is not None:
                index.setdefault(text, []).append(i)
        return cls(kind, texts, frozenset(partial), index, frozenset(index.get(" ", ())))

    def __len__(self) -> int:
        return len(self.texts)

    @cached_property
    def has_text(self) -> torch.Tensor:
        """(size,) bool: which ids stand for text of their own."""
        return torch.tensor([t is not None for t in self.texts], dtype=torch.bool)

    @cached_property
    def digest(self) -> str:
        """sha256 of the type and every id's text (None included): what a cache built from it depends on."""
        return hashlib.sha256(json.dumps([self.kind, self.texts]).encode("utf-8", "surrogatepass")).hexdigest()

    def ids_of(self, text: str) -> list[int]:
        """Every id whose whole text is `text` (SentencePiece may spell one text twice: `\\n` and `<0x0A>`)."""
        return self.index.get(text, [])


_VOCABULARIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> (key, Vocabulary)


def vocabulary_of(member) -> Vocabulary:
    """The member's normalised vocabulary, built once per loaded model (its tokenizer is loaded with it;
    clones of a member share both) and remembered while the model lives."""
    excluded = frozenset(member.tokenisation.control_ids) | frozenset(member.tokenisation.eos_ids)
    key = (member.runner.vocab_size, excluded)
    cached = _VOCABULARIES.get(member.model)
    if cached is None or cached[0] != key:
        cached = (key, Vocabulary.build(*member.tokenisation.vocabulary_bytes(), excluded))
        _VOCABULARIES[member.model] = cached
    return cached[1]


def common_texts(vocabularies: list[Vocabulary]) -> list[str]:
    """The texts every vocabulary holds as one token, in a fixed order (sorted), e.g. DeePEn's anchors."""
    shared = set(vocabularies[0].index)
    for v in vocabularies[1:]:
        shared &= v.index.keys()
    return sorted(shared)


# ---- knobs shared by the token-level methods --------------------------------------------------------


def check_weights(method: str, weights) -> None:
    """Ensemble weights: each in [0, 1], summing to 1 (None: uniform)."""
    if weights is None:
        return
    weights = list(weights)
    if not weights or any(not 0 <= w <= 1 for w in weights):
        raise ConfigError(f"{method}: weights must each lie in [0, 1], got {weights}")
    if abs(sum(weights) - 1) > 1e-6:
        raise ConfigError(f"{method}: weights must sum to 1, got {weights} (sum {sum(weights)})")


def member_weights(method: str, weights, k: int) -> list[float]:
    if weights is None:
        return [1.0 / k] * k
    if len(weights) != k:
        raise ConfigError(f"{method}: {len(weights)} weights for {k} members")
    return [float(w) for w in weights]
