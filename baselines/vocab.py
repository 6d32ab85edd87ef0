"""Vocabulary normalisation for the token-level baselines (UniTE, DeePEn): every id -> the text it stands for.

Token-level ensembles compare tokens of different tokenizers by their text (research notes
../shared/research/baselines.md §7.2). Each vocabulary spells text its own way:

- byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen): every character of a token stands for one byte
  through GPT-2's byte-to-unicode table (`Ġ` = space, `Ċ` = newline, `Ã¼` = the two bytes of "ü");
- SentencePiece (Llama 2, Mistral, Gemma): `▁` stands for a space and `<0xNN>` for a raw byte
  (byte fallback); every other character is itself.

The type is detected from the vocabulary itself (the share of `Ġ`- vs `▁`-prefixed entries), never
from a model's name. Added tokens (Gemma's newline runs, `<|im_end|>`) are stored as their literal
content in both types.

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
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import torch

from adafuse.errors import ConfigError

BYTE_LEVEL = "byte_level"
SENTENCEPIECE = "sentencepiece"
SPIECE_SPACE = "\u2581"  # ▁
BPE_SPACE = "\u0120"  # Ġ


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's table read backwards: the character a byte-level vocabulary writes -> the byte it stands for.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7F-0xA0, 0xAD)
    are shifted to the characters 256, 257, ... in byte order, so every byte has a visible character.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def detect_type(pieces: dict[str, int]) -> str:
    """BYTE_LEVEL or SENTENCEPIECE, from the share of entries that start with `Ġ` vs `▁`.

    Neither marker in 1% of the entries: refused (a WordPiece vocabulary, say, needs its own rule).
    """
    bpe = sum(p.startswith(BPE_SPACE) for p in pieces)
    spm = sum(p.startswith(SPIECE_SPACE) for p in pieces)
    if max(bpe, spm) < 0.01 * max(len(pieces), 1):
        raise ConfigError(
            f"cannot tell the tokenizer type: {bpe} of {len(pieces)} entries start with 'Ġ' and {spm} with '▁'"
            " (only byte-level BPE and SentencePiece vocabularies are supported)"
        )
    return BYTE_LEVEL if bpe > spm else SENTENCEPIECE


def _piece_bytes(piece: str, kind: str) -> bytes | None:
    """The bytes a vocabulary piece stands for (None if the piece is not in the type's alphabet)."""
    if kind == BYTE_LEVEL:
        alphabet = byte_level_alphabet()
        if any(c not in alphabet for c in piece):
            return None
        return bytes(alphabet[c] for c in piece)
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace(SPIECE_SPACE, " ").encode("utf-8")


@dataclass
class Vocabulary:
    """One tokenizer's ids as text. `texts[i]` is id i's text or None (see the module docstring)."""

    kind: str  # BYTE_LEVEL or SENTENCEPIECE
    texts: list[str | None]  # one per logit column
    partial: frozenset[int]  # ids whose bytes are not whole characters (they may start or end one)
    index: dict[str, list[int]] = field(default_factory=dict)  # text -> ids that stand for it, ascending
    bare_space: frozenset[int] = frozenset()  # ids whose text is exactly " "

    @classmethod
    def build(cls, tokenizer, size: int, excluded=frozenset()) -> "Vocabulary":
        """Normalise `tokenizer`'s vocabulary; `size` is the logits' width, `excluded` the ids that are
        never text (control and eos ids)."""
        pieces = tokenizer.get_vocab()
        kind = detect_type(pieces)
        added = {i: tok.content for i, tok in tokenizer.added_tokens_decoder.items()}
        texts: list[str | None] = [None] * size
        partial = set()
        for piece, i in pieces.items():
            if i >= size or i in excluded:
                continue
            raw = added[i].encode("utf-8") if i in added else _piece_bytes(piece, kind)
            if not raw:
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


def vocabulary_of(member) -> Vocabulary:
    """The member's normalised vocabulary, built once per tokenizer and remembered on the tokenizer
    (members that share a tokenizer, like clones, share it)."""
    excluded = frozenset(member.control_ids) | frozenset(member.eos_ids)
    key = (member.vocab_size, excluded)
    cached = getattr(member.tokenizer, "_adafuse_vocabulary", None)
    if cached is None or cached[0] != key:
        cached = (key, Vocabulary.build(member.tokenizer, member.vocab_size, excluded))
        member.tokenizer._adafuse_vocabulary = cached
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
