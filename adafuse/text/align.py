"""Text another model chose, as this model reads it after its context (spec §4): pure functions of a
tokenisation, a context and the shared text, no forward pass (adafuse/member/member.py `Member.read` reads them).

The rule: encode (prompt + generated text + the new text) and keep the longest common prefix with the
context ids. Usually that is the whole context and the ids after it carry the new text. Where the boundary
re-tokenises ("\n" + "\n" into "\n\n", a prompt that ends in a space), the context is cut back to the common
prefix and re-read. The cut-back never reaches before the start of the last committed word (the context's
`anchor`): where the full encoding departs from the context earlier (the context holds this model's own,
non-canonical ids, or a chat template's control tokens), the text from the anchor on plus the new text is
encoded on its own, after ids[:anchor]. Either way, the ids re-read are bounded by the new text plus the last
committed word. Tokens that lie wholly before the new text's first character are `skip`: fed, never scored.
"""

import re
from dataclasses import dataclass
from typing import Protocol

from adafuse.text.tokenisation import Tokenisation
from adafuse.text.words import ends_inside_char

# The last word of a text (spec §2: whitespace, then non-whitespace), with any whitespace after it.
_LAST_WORD = re.compile(r"\s*\S+\s*$")


@dataclass
class Alignment:
    """Text that another model chose, as this model reads it after its context (see `align`)."""

    base: int  # context ids kept: all of them, or fewer where the boundary re-tokenises
    ids: list[int]  # ids read after the kept context
    skip: int  # leading ids that lie wholly before the text's first character: context, fed but never scored


class Committed(Protocol):
    """What alignment reads of a model's context (adafuse/member/context.py `Context`)."""

    ids: list[int]  # the committed ids
    prompt_text: str  # the prompt as the model reads it
    anchor: int  # where the last committed word starts in `ids`


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists (list slices compare in C; bisect on a miss)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def align(tok: Tokenisation, context: Committed, generated: str, text: str) -> Alignment:
    """How a model reads `text` after its `context`, whose generated text is `generated` (module docstring)."""
    ids = context.ids
    encoded = tok.encode_text(context.prompt_text + generated + text, add_special_tokens=not tok.chat_template)
    keep = common_prefix(encoded, ids)
    anchor = context.anchor
    if keep >= anchor:
        new = encoded[keep:]
    else:
        window = tok.text_of(ids[anchor:], ids[:anchor])
        encoded = tok.encode_text(window + text)
        common = common_prefix(encoded, ids[anchor:])
        keep, new = anchor + common, encoded[common:]
    reread = tok.text_of(ids[keep:], ids[:keep])
    skip = 0
    while skip < len(new) and reread:
        covered = tok.text_of(new[: skip + 1], ids[:keep])
        if len(covered) > len(reread) or not reread.startswith(covered) or ends_inside_char(covered):
            break
        skip += 1
    return Alignment(keep, new, skip)


def last_word_start(tok: Tokenisation, ids: list[int], whole: str, lowest: int) -> int:
    """The index of the token that holds the first character of the last word of `whole` (the prompt and the
    generated text that `ids` carry, spec §2), scanning back from the end no further than `lowest`."""
    last = _LAST_WORD.search(whole)
    length = len(whole) - last.start() if last else len(whole)
    for i in range(len(ids) - 1, lowest - 1, -1):
        if len(tok.text_of(ids[i:], ids[:i])) >= length:
            return i
    return lowest
