"""Words (spec §2): a run of non-whitespace characters with the whitespace before it.

The rule reads only decoded text, so it is the same for byte-level BPE (`Ġ`, `Ċ`) and
SentencePiece (`▁`, byte fallback) vocabularies: " Paris", "\n\nQuestion:", " $18.50," are words.
Text is always decoded in context (decode(context + span) minus decode(context)), because a token's
text depends on its neighbours: SentencePiece drops or keeps a leading space, and byte-level BPE
splits multi-byte characters across tokens.
"""

import functools

REPLACEMENT = "\ufffd"  # what a decoder emits for an incomplete UTF-8 sequence
# A UTF-8 character has at most 4 bytes and no vocabulary spells a byte with more than one token, so a
# character that a token leaves unfinished is finished within this many more tokens, or never.
CHAR_SLACK = 4


def ends_inside_char(text: str) -> bool:
    """True when the text stops part-way through a multi-byte character."""
    return text.endswith(REPLACEMENT)


def is_word_complete(text: str, next_text: str | None, next_is_eos: bool) -> bool:
    """Spec §2.2: does `text` end a word, given the text the (already computed) next token would add?

    An end-of-sequence next token always ends the word, even a whitespace-only one: nothing can
    follow it, and the candidate then carries the `eos` flag.
    """
    if next_is_eos:
        return True
    if not text or text.isspace() or ends_inside_char(text):
        return False
    return text[-1].isspace() or bool(next_text) and next_text[0].isspace()


class Detokenizer:
    """Decodes spans in context, reading only a short tail of the context instead of all of it.

    The tail starts at a token that decodes cleanly on its own, i.e. at a character boundary, so the
    characters after it decode exactly as in the full text. If the tail's text is not a prefix of
    the tail+span text (the context itself ends inside a character), it falls back to the full
    context, as the spec states the rule.
    """

    def __init__(self, tokenizer, tail_tokens: int = 8, max_scan: int = 64, kept: int = 4096):
        self.tokenizer = tokenizer
        self.tail_tokens = tail_tokens
        self.max_scan = max_scan
        self._clean: dict[int, bool] = {}
        # The last `kept` texts decoded, kept: nine decodes in ten repeat one made shortly before (each step of a
        # word decodes its context's tail again; tools/bench_host.py's decode made 17,859, 1,956 of them distinct,
        # at 25 us each)
        self._decoded = functools.lru_cache(maxsize=kept)(self._decode_ids)

    def decode(self, ids: list[int]) -> str:
        return self._decoded(tuple(ids))

    def _decode_ids(self, ids: tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _starts_clean(self, token: int) -> bool:
        if token not in self._clean:
            piece = self.decode([token])
            self._clean[token] = bool(piece) and REPLACEMENT not in piece
        return self._clean[token]

    def _tail_start(self, context: list[int]) -> int:
        start = max(len(context) - self.tail_tokens, 0)
        for i in range(start, max(start - self.max_scan, 0) - 1, -1):
            if i == 0 or self._starts_clean(context[i]):
                return i
        return 0

    def text(self, context: list[int], span: list[int]) -> str:
        """The text `span` adds when it follows `context`."""
        start = self._tail_start(context)
        while True:
            head = self.decode(context[start:])
            whole = self.decode(context[start:] + span)
            if whole.startswith(head):
                return whole[len(head) :]
            if start == 0:
                # The context ends inside a character that the span completes: the completed
                # character is the span's text.
                common = 0
                while common < min(len(head), len(whole)) and head[common] == whole[common]:
                    common += 1
                return whole[common:]
            start = 0
