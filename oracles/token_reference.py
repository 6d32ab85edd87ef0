"""What the slow references of the token-level baselines share: each member's context replayed with no
KV cache, every distribution from a full forward pass over the whole token sequence, text appended
exactly as the seam's rule says (oracles/reference.py's `align`), and the stop rule of spec §5.

Token texts come from the tokenizer's own `decode` of each id after a letter (in context, as the
engine reads them: a SentencePiece decoder such as Mistral's drops a first token's leading space),
not from baselines/vocab.py.
"""

import torch

from oracles.reference import RefModel, align, last_word_start

PARTIAL = "\ufffd"
_TEXTS: dict = {}  # (tokenizer id, size) -> each id's text: decoding 262k ids takes a second
_IDS_BY_TEXT: dict = {}  # (tokenizer id, size) -> text -> ids


class RefMember:
    """One member's context: its ids, where its generated text starts, and its last word's start."""

    def __init__(self, member, prompt: str):
        self.m = RefModel(member)
        self.vocab_size = member.runner.vocab_size
        self.ids = self.m.encode_prompt(prompt)
        self.prompt_text = self.m.render(prompt)
        self.prompt_len = len(self.ids)
        after_control = max((i + 1 for i, x in enumerate(self.ids) if x in self.m.control), default=0)
        self.anchor = last_word_start(self.m, self.ids, self.prompt_text, max(after_control, 1))

    @property
    def eos_ids(self):
        return self.m.eos_ids

    def logprobs(self) -> torch.Tensor:
        """The next-token log-probabilities from one cache-free forward pass over every id."""
        return self.m.logprobs(self.ids, 1)[-1]

    def texts(self) -> list[str | None]:
        """Each id's text as the tokenizer decodes it alone; None for eos, control, partial and empty ids."""
        key = (id(self.m.tokenizer), self.vocab_size)
        if key not in _TEXTS:
            out = set(self.m.control) | set(self.m.eos_ids)
            (letter,) = self.m.encode_text("a", specials=False)
            texts = [self.m.decode([letter, i])[1:] for i in range(self.vocab_size)]
            _TEXTS[key] = [None if i in out or not t or PARTIAL in t else t for i, t in enumerate(texts)]  # fmt: skip
        return _TEXTS[key]

    def ids_by_text(self) -> dict[str, list[int]]:
        """Each text of `texts()` -> the ids whose text it is, in id order: one pass, remembered per tokenizer."""
        key = (id(self.m.tokenizer), self.vocab_size)
        if key not in _IDS_BY_TEXT:
            table: dict[str, list[int]] = {}
            for i, t in enumerate(self.texts()):
                if t is not None:
                    table.setdefault(t, []).append(i)
            _IDS_BY_TEXT[key] = table
        return _IDS_BY_TEXT[key]

    def add_own(self, ids: list[int], generated: str) -> None:
        self.ids = self.ids + ids
        self.anchor = last_word_start(self.m, self.ids, self.prompt_text + generated, self.anchor)

    def add_text(self, before: str, text: str) -> None:
        base, ids, _ = align(self.m, self.ids, self.anchor, self.prompt_text + before, text)
        self.ids = self.ids[:base] + ids
        self.prompt_len = min(self.prompt_len, base)
        self.anchor = last_word_start(self.m, self.ids, self.prompt_text + before + text, self.anchor)

    def generated(self) -> list[int]:
        return self.ids[self.prompt_len :]


def stopped(text: str, stop, refs: list[RefMember], max_new_tokens: int) -> tuple[str, str]:
    """Spec §5 after a step: (text cut at the first stop string, reason or "")."""
    hits = [text.find(s) for s in stop if s in text]
    if hits:
        return text[: min(hits)], "stop"
    if any(len(r.generated()) >= max_new_tokens for r in refs):
        return text, "length"
    return text, ""
