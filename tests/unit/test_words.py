"""The word rule (spec §2) on strings, and on both real tokenizers: byte-level BPE and SentencePiece."""

import random
import re

import pytest

from adafuse.text.words import ends_inside_char, is_word_complete


@pytest.mark.parametrize(
    "text, next_text, eos, complete",
    [
        (" Paris", " is", False, True),  # the next token starts a new word
        (" Paris", ",", False, False),  # punctuation stays attached
        (" Paris,", "\n", False, True),  # a newline starts the next word
        (" Par", "is", False, False),
        ("\n\n", "Question", False, False),  # whitespace alone is not a word yet
        ("\n\nQuestion:", " who", False, True),
        (" Paris.\n", "Question", False, True),  # a token that ends in whitespace ends the word
        (" ", " nice", False, False),
        (" caf\ufffd", " ", False, False),  # inside a multi-byte character: never complete
        (" Paris", "</s>", True, True),  # end-of-sequence always ends the word
        ("\n", None, True, True),
        ("", " x", False, False),
        (" 18", ".", False, False),
        (" 18.50", " dollars", False, True),
        ("\tWhy?", " 18", False, True),
    ],
)
def test_word_rule_on_strings(text, next_text, eos, complete):
    assert is_word_complete(text, next_text, eos) is complete


def test_ends_inside_char():
    assert ends_inside_char("caf\ufffd")
    assert not ends_inside_char("café")


TEXTS = [
    " Paris is  nice.\n\nQuestion:\tWhy? $18.50, Größe über 日本語 😀! end",  # mixed
    " one  two   three",  # runs of spaces
    "\n\n\nAnswer:\n42\n",  # newlines
    "\tx\t\ty",  # tabs
    " Hello, world! (really?) [yes] {no} \"quoted\" 'single'",  # punctuation
    " 1234567 3.14159 1,000,000 -42 +7",  # digits, split one per token
    " Größe Übermut Straße ÄÖÜäöüß",  # umlauts
    " 東京は日本の首都です。 中文 한국어",  # CJK
    " 😀😃 🍕🍕 👍🏽 ❤️ end",  # emoji, incl. modifiers and variation selectors
]


def segment(member, context: str, text: str) -> list[str]:
    """Split `text` into words as greedy decoding would, feeding its real tokens one by one."""
    ctx = member.tokenisation.encode(context)
    full = member.tokenisation.encode(context + text)
    assert full[: len(ctx)] == ctx
    ids, words, current = full[len(ctx) :], [], []
    for i, token in enumerate(ids):
        current.append(token)
        word = member.text_of(current, ctx)
        next_text = member.text_of([ids[i + 1]], ctx + current) if i + 1 < len(ids) else " "
        if is_word_complete(word, next_text, False):
            words.append(word)
            ctx, current = ctx + current, []
    return words


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_both_tokenizers_split_text_into_whitespace_led_words(tiny, text):
    expected = re.findall(r"\s*\S+", text)
    for member in tiny.members:
        assert segment(member, "Answer:", text) == expected, member.name


@pytest.mark.slow
def test_in_context_decoding_equals_decoding_the_whole_text(tiny):
    """Detokenizer.text reads only a tail of the context; it must equal decode(ctx + span) - decode(ctx)."""
    rng = random.Random(0)
    text = "".join(TEXTS) * 3
    for member in tiny.members:
        ids = member.tokenisation.encode(text)
        decode = member.tokenisation.detokenizer.decode
        for _ in range(300):
            cut = rng.randrange(1, len(ids) - 1)
            span = ids[cut : cut + rng.randrange(1, 12)]
            head, whole = decode(ids[:cut]), decode(ids[:cut] + span)
            if head.endswith("\ufffd"):  # the context itself ends inside a character
                continue
            assert member.text_of(span, ids[:cut]) == whole[len(head) :]


class Counting:
    """A tokenizer's decode that counts what it is asked."""

    def __init__(self, tokenizer):
        self.tokenizer, self.asked = tokenizer, []

    def decode(self, ids, **kwargs):
        self.asked.append(tuple(ids))
        return self.tokenizer.decode(ids, **kwargs)


def test_a_repeated_decode_is_the_tokenizer_s_text_without_asking_it_again(tiny):
    """Detokenizer.decode keeps the last texts it made (`kept`): a word's steps decode the same context tail again
    and again. Every text is the tokenizer's own, for ids seen once, again, and after being pushed out."""
    from adafuse.text.words import Detokenizer

    for member in tiny.members:
        tokenizer = member.tokenisation.tokenizer
        counting = Counting(tokenizer)
        detokenizer = Detokenizer(counting, kept=4)
        ids = member.tokenisation.encode(" The capital of France is Paris, a city of cafés.")
        tails = [ids[i:] for i in range(6)]
        own = [tokenizer.decode(t, skip_special_tokens=False, clean_up_tokenization_spaces=False) for t in tails]
        assert [detokenizer.decode(t) for t in tails[:2]] == own[:2] and len(counting.asked) == 2
        assert [detokenizer.decode(t) for t in tails[:2]] == own[:2] and len(counting.asked) == 2  # kept
        assert [detokenizer.decode(t) for t in tails[2:]] == own[2:] and len(counting.asked) == 6
        assert detokenizer.decode(tails[0]) == own[0] and len(counting.asked) == 7  # pushed out by the four after it
