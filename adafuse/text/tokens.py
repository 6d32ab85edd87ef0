"""Every token's bytes, and the rule that keeps generated text Unicode (spec §2; docs/algorithm.md, "Text is Unicode").

A vocabulary spells bytes its own way:

- byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen): every character of a token stands for one byte
  through GPT-2's byte-to-unicode table (`Ġ` = space, `Ċ` = newline, `Ã¼` = the two bytes of "ü");
- SentencePiece (Llama 2, Mistral, Gemma): `▁` stands for a space and `<0xNN>` for a raw byte
  (byte fallback); every other character is itself.

The type is detected from the vocabulary itself (the share of `Ġ`- vs `▁`-prefixed entries), never
from a model's name. Added tokens stand for their literal content.

The rule. A token may end part-way through a multi-byte character (Llama 3 spells "🍕" with two
tokens), but bytes that can never become a character (a token that starts a new character, or ends
the sequence, while the last one is unfinished; a lone continuation byte where a character should
start) are not text, and a decoder would put U+FFFD into the shared text for them. So wherever a
decoder chooses a token to extend a word (the word's first token, a branch, a greedy completion, a
beam expansion), it takes the most probable token whose bytes keep the word valid UTF-8 so far
(`TokenBytes.allowed`). The distribution itself is unchanged: margins and scores read it as it is.
"""

import codecs
import logging
from functools import lru_cache

import torch

from adafuse.errors import ConfigError
from adafuse.text.top import best

log = logging.getLogger(__name__)

BYTE_LEVEL = "byte_level"
SENTENCEPIECE = "sentencepiece"
SPIECE_SPACE = "\u2581"  # ▁
BPE_SPACE = "\u0120"  # Ġ


class UnknownVocabularyType(ConfigError):
    """Neither a byte-level BPE nor a SentencePiece vocabulary."""


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


def detect_type(pieces) -> str:
    """BYTE_LEVEL or SENTENCEPIECE, from the share of entries that start with `Ġ` vs `▁`.

    Neither marker in 1% of the entries: UnknownVocabularyType (a WordPiece vocabulary, say).
    """
    bpe = sum(p.startswith(BPE_SPACE) for p in pieces)
    spm = sum(p.startswith(SPIECE_SPACE) for p in pieces)
    if max(bpe, spm) < 0.01 * max(len(pieces), 1):
        raise UnknownVocabularyType(
            f"cannot tell the tokenizer type: {bpe} of {len(pieces)} entries start with 'Ġ' and {spm} with '▁'"
            " (only byte-level BPE and SentencePiece vocabularies are supported)"
        )
    return BYTE_LEVEL if bpe > spm else SENTENCEPIECE


def piece_bytes(piece: str, kind: str) -> bytes | None:
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


def vocabulary_bytes(tokenizer, size: int) -> tuple[str, list[bytes | None]]:
    """(type, each id's bytes): added tokens stand for their content; ids past the vocabulary for nothing."""
    pieces = tokenizer.get_vocab()
    kind = detect_type(pieces)
    added = {i: tok.content for i, tok in tokenizer.added_tokens_decoder.items()}
    out: list[bytes | None] = [None] * size
    for piece, i in pieces.items():
        if i < size:
            out[i] = added[i].encode("utf-8") if i in added else piece_bytes(piece, kind)
    return kind, out


def unfinished(data: bytes) -> bytes:
    """The trailing bytes of `data` that begin a character not yet finished (b"" at a character boundary)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the last character starts here
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return data[-back:] if back < need else b""
    return b""


def _valid_prefix(data: bytes) -> bool:
    try:  # nearly every token is whole characters: one plain decode answers, without a decoder object
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        pass
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(data, final=False)
    except UnicodeDecodeError:
        return False
    return True


class TokenBytes:
    """One vocabulary's bytes and which tokens may come next in a word (see the module docstring).

    Ids without bytes (control tokens, eos) are always allowed at a character boundary: masking
    control tokens and ending at eos are other rules' business. A vocabulary of an unknown type
    allows everything (the rule is off: `kind` is None), with a warning when its TokenBytes is built
    (once per tokenizer: `token_bytes`).
    """

    def __init__(self, tokenizer, size: int):
        try:
            self.kind, self.bytes = vocabulary_bytes(tokenizer, size)
        except UnknownVocabularyType as err:
            self.kind, self.bytes = None, [None] * size
            log.warning(
                "tokenizer %s: the UTF-8 rule is off (%s): its words may end part-way through a character",
                getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__,
                err,
            )
        self.can_start = torch.tensor([b is None or _valid_prefix(b) for b in self.bytes], dtype=torch.bool)
        # Tokens that may finish a character: their bytes begin with a continuation byte.
        self._continuing = [i for i, b in enumerate(self.bytes) if b and b[0] & 0xC0 == 0x80]
        self._after: dict[bytes, torch.Tensor] = {}

    def pending(self, ids: list[int]) -> bytes:
        """The unfinished character at the end of `ids`, which start at a character boundary."""
        return unfinished(b"".join(self.bytes[i] or b"" for i in ids))

    def allowed(self, pending: bytes) -> torch.Tensor:
        """(size,) bool: the tokens that may follow `pending` (b"": a character boundary)."""
        if not pending or self.kind is None:
            return self.can_start
        if pending not in self._after:
            mask = torch.zeros_like(self.can_start)
            ok = [i for i in self._continuing if _valid_prefix(pending + self.bytes[i])]
            mask[ok] = True
            self._after[pending] = mask if ok else self.can_start  # nothing can finish it: the rule is off here
        return self._after[pending]

    def restrict(self, logprobs: torch.Tensor, pending: bytes = b"") -> torch.Tensor:
        """`logprobs` with the tokens that may not follow `pending` at -inf (a new tensor)."""
        allowed = self.allowed(pending).to(logprobs.device)
        return logprobs.masked_fill(~allowed[: logprobs.shape[-1]], float("-inf"))

    def choose(self, logprobs: torch.Tensor, pending: bytes = b"") -> int:
        """The most probable token that may follow `pending`."""
        first = best(logprobs)
        if bool(self.allowed(pending)[first]):
            return first
        return best(self.restrict(logprobs, pending))


def token_bytes(tokenizer, size: int) -> TokenBytes:
    """The tokenizer's TokenBytes for logits of width `size`, built once and kept on the tokenizer
    (members that share a tokenizer, like clones, share it)."""
    cached = getattr(tokenizer, "_adafuse_token_bytes", None)
    if cached is None or len(cached.bytes) != size:
        cached = TokenBytes(tokenizer, size)
        tokenizer._adafuse_token_bytes = cached
    return cached
