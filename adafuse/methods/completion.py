"""Greedy word completion (spec §2), for every method that builds text word by word: AdaFuse's proposals and
branches (adafuse/methods/adafuse.py), SweetSpan's spans (baselines/sweetspan.py).

From a given first token, a row takes the argmax next token until its word is complete: its text holds a
non-whitespace character and either ends with whitespace, or the next token (already computed) starts with
whitespace or ends the sequence; that next token is not part of the word, and its distribution is the one
the next word's confidence test reads. A word is cut at `max_tokens`, never inside a character: it runs on
for up to `CHAR_SLACK` tokens to finish one, and is cut back to its last character boundary if it cannot.
Every choice is the most probable token that keeps the word valid UTF-8 (adafuse/text/tokens.py).
"""

from dataclasses import dataclass

import torch

from adafuse.member.context import Rows
from adafuse.text.words import CHAR_SLACK, ends_inside_char, is_word_complete


@dataclass
class Word:
    ids: list[int]
    logprobs: list[float]  # log p of each id in context
    text: str
    eos: bool  # the model's next token after the word is end-of-sequence
    next_logprobs: torch.Tensor  # the distribution after the word
    cut: bool = False  # cut back to a character boundary at the token cap: its row cannot be extended


@dataclass(frozen=True)
class Settles:
    """Yielded by `complete_words` before each step, where a round may end early (adafuse/methods/adafuse.py
    `RoundEnd`): whether the text of every word still growing, and of the complete ones that end candidates,
    settles the round's ending there. Never a pass: the caller that asked for it consumes it."""

    settled: bool


def complete_words(
    m,
    rows: Rows,
    firsts: list[int],
    logprobs: torch.Tensor,
    before: list[Word],
    max_tokens: int,
    ending=None,
    last: bool = False,
):
    """Complete each first token greedily into a word, row i of `rows` taking firsts[i] (a program): the
    words, in row order. The rows are read as one batch, one token per step, until every row has a complete
    word. `before` holds the words already committed in this round (the context ends after them).

    With `ending` (adafuse/methods/adafuse.py `RoundEnd`), a `Settles` is yielded before each step: whether every row
    still growing has text that settles `ending`, and so do the rows already complete if their words end
    candidates (`last`). They change nothing in the steps: run on after any of them, the words are the ones
    it would make."""
    context = m.ids + [i for w in before for i in w.ids]
    committed = "".join(w.text for w in before)
    words: list[Word | None] = [None] * len(firsts)
    ids = [[t] for t in firsts]
    lps = [[logprobs[t].item()] for t in firsts]
    dists: list[list[torch.Tensor]] = [[] for _ in firsts]  # dists[i][j]: the distribution after ids[i][: j + 1]
    feed = [[t] for t in firsts]
    texts: list[str] = [""] * len(firsts)  # texts[i]: the text of ids[i], its last token not read yet
    for i, t in enumerate(firsts):
        if t in m.tokenisation.eos_ids:  # end-of-sequence as the first token: the empty word, flagged eos
            words[i], feed[i] = Word([], [], "", True, logprobs), []
    while any(feed):
        for i, fed in enumerate(feed):
            if fed:
                texts[i] = m.text_of(ids[i], context)
        if ending is not None and ending.possible:
            # text that ends inside a character is not a prefix of the word's text: that character will change
            growing = [
                None if ends_inside_char(texts[i]) else ending.cut(committed + texts[i], False)
                for i, fed in enumerate(feed)
                if fed
            ]
            complete = [ending.cut(committed + w.text, True) for w in words if w is not None] if last else []
            yield Settles(None not in growing and ending.agree(growing + complete))
        elif ending is not None:
            yield Settles(False)
        step = yield from rows.extend(feed)
        for i, fed in enumerate(feed):
            if not fed:
                continue
            dist = step[i, 0]
            dists[i].append(dist)
            nxt = m.tokenisation.tokens.choose(dist, m.tokenisation.tokens.pending(ids[i]))
            text = texts[i]
            at_eos = nxt in m.tokenisation.eos_ids
            next_text = None if at_eos or ends_inside_char(text) else m.text_of([nxt], context + ids[i])
            capped = len(ids[i]) >= max_tokens and not ends_inside_char(text)
            if capped or is_word_complete(text, next_text, at_eos):
                words[i], feed[i] = Word(ids[i], lps[i], text, at_eos, dist), []
            elif len(ids[i]) >= max_tokens + CHAR_SLACK:
                word = Word(ids[i], lps[i], text, False, dist)
                words[i], feed[i] = cut_to_char(m, rows, i, word, dists[i], context), []
            else:
                ids[i].append(nxt)
                lps[i].append(dist[nxt].item())
                feed[i] = [nxt]
    return words


def cut_to_char(m, rows: Rows, row: int, word: Word, dists: list[torch.Tensor], context: list[int]) -> Word:
    """`word` (row `row` of `rows`) cut back to its longest prefix that ends on a character boundary.

    A word of bytes that form no character at all is kept whole: its replacement characters are not
    a partial character that a later token could complete.
    """
    for n in range(len(word.ids) - 1, 0, -1):
        text = m.text_of(word.ids[:n], context)
        if not ends_inside_char(text):
            rows.truncate(row, len(rows.tokens[row]) - (len(word.ids) - n), dists[n - 1])
            return Word(word.ids[:n], word.logprobs[:n], text, False, dists[n - 1], cut=True)
    return word
