"""Does a prompt fit each model's context? Asked away from the thread that decodes (a server's request handlers),
and answered for a prompt of any size without reading all of it.

A fast tokenizer's settings are state that each of its calls sets (transformers writes `encode_special_tokens`
per call: the engine encodes other models' words with special tokens split, a prompt without), so two threads
must not share one. A PromptCheck holds its own copy of each model's tokenization, with a tokenizer of its own; the
prompts it tokenises are kept in the store of encoded prompts that copy shares with the engine's (`encode_prompt`),
so a prompt checked here is not tokenised again when it is read.

No token of a model stands for more bytes of text than its longest token's (special tokens spelled out
included), so a prompt of more bytes than the context's positions times that has more tokens than the context
holds: it is refused at once, before any tokenizer reads it. A tokenizer whose normalizer can shrink text first
(Unicode normalization or lowercasing: at most 4 bytes to 1, as NFKC maps a 4-byte mathematical letter to an
ASCII one) gets that factor; one that can shrink it without bound (a rule that collapses runs of spaces,
a precompiled SentencePiece map) gets no bound, and its prompts are tokenized whole, still on the checker's
thread. Only a prompt within every bound is tokenized, and so at most that many bytes.
"""

import copy
import json

from adafuse.errors import ContextLengthError

# How far a normalizer can shrink the bytes of the text it reads: none for the ones that only add or replace
# equal or longer strings; Unicode's compatibility and case mappings at most 4 bytes to 1.
UNICODE_SHRINK = 4
UNICODE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}


class PromptCheck:
    """`lengths(prompt, reserve)`: each loaded model's count of the prompt's tokens, as `Ensemble.prompt_lengths`
    gives it, from this object's own copies of the tokenizers. Use it from one thread at a time."""

    def __init__(self, members: list):
        self._models = [None if m is None else _Model(m) for m in members]

    def max_bytes(self, reserve: int = 0) -> list[int | None]:
        """Per model, the most UTF-8 bytes a prompt can have and still leave `reserve` positions of its context
        (None: not loaded, or no bound known)."""
        return [None if m is None else m.max_bytes(reserve) for m in self._models]

    def lengths(self, prompt: str, reserve: int = 0) -> list[int | None]:
        """Raises ContextLengthError if the prompt leaves some model fewer than `reserve` positions (at once if its
        bytes alone say so), DataError if it encodes to no tokens."""
        size = len(prompt.encode("utf-8")) + len(getattr(prompt, "system", "").encode("utf-8"))
        for model in filter(None, self._models):
            bound = model.max_bytes(reserve)
            if bound is not None and size > bound:
                raise ContextLengthError(
                    f"model {model.name!r}: a prompt of {size} bytes has more than {model.positions - reserve} tokens "
                    f"(no token of the model stands for more than {model.longest * model.shrink} bytes of a prompt) "
                    f"and decoding may add {reserve}, but the model's context holds {model.positions}"
                )
        return [
            None if m is None else len(m.tokenisation.prompt_ids(prompt, reserve, m.positions)) for m in self._models
        ]


class _Model:
    def __init__(self, member):
        self.name = member.name
        self.positions = member.runner.max_positions
        self.tokenisation = copy.copy(member.tokenisation)
        self.tokenisation.tokenizer = copy.deepcopy(member.tokenisation.tokenizer)  # its own settings' state
        self.longest = _longest_token_bytes(member.tokenisation)
        self.shrink = _normalizer_shrink(member.tokenisation.tokenizer)

    def max_bytes(self, reserve: int) -> int | None:
        if self.positions is None or self.longest is None or self.shrink is None:
            return None
        return max(self.positions - reserve, 0) * self.longest * self.shrink


def _longest_token_bytes(tokenisation) -> int | None:
    """The most bytes of text one token stands for: its vocabulary's longest token, or the longest special or
    added token spelled out; None for a vocabulary of a type whose tokens' bytes are not known."""
    tokens = tokenisation.tokens
    if tokens.kind is None:
        return None
    spelled = [len(token.content.encode("utf-8")) for token in tokenisation.tokenizer.added_tokens_decoder.values()]
    return max([len(b) for b in tokens.bytes if b is not None] + spelled)


def _normalizer_shrink(tokenizer) -> int | None:
    """How many bytes of input the tokenizer's normalizer may turn into one (1: it never shrinks text), or None
    where it may shrink text without bound. A tokenizer without a fast backend is not bounded."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    normalizer = backend.normalizer  # read alone: the whole tokenizer as JSON takes a second for a 262k vocabulary
    return _shrink(None if normalizer is None else json.loads(normalizer.__getstate__()))


def _shrink(normalizer: dict | None) -> int | None:
    if normalizer is None or normalizer["type"] == "Prepend":
        return 1
    if normalizer["type"] == "Sequence":
        factor = 1
        for part in normalizer["normalizers"]:
            shrink = _shrink(part)
            if shrink is None:
                return None
            factor *= shrink
        return factor
    if normalizer["type"] == "Replace" and "String" in normalizer["pattern"]:
        pattern, content = normalizer["pattern"]["String"].encode(), normalizer["content"].encode()
        return 1 if len(content) >= len(pattern) else (-(-len(pattern) // len(content)) if content else None)
    if normalizer["type"] in UNICODE_NORMALIZERS:
        return UNICODE_SHRINK
    return None
