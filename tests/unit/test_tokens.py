"""Token bytes and the rule that keeps generated text Unicode (adafuse/text/tokens.py), on small hand-made
byte-level vocabularies; the bytes of real tokenizers, read back against their own decoding; and a
vocabulary of no known type, for which the rule is off, said and recorded."""

import codecs
import logging

import pytest
import torch

from adafuse import Ensemble
from adafuse.member.member import Member
from adafuse.text.tokens import TokenBytes, unfinished
from eval.runner import record_text_rules
from tests.support.members import FakeTokenizer

# A byte-level vocabulary: "Ġ" is a space; "Ã" and "¼" are the two bytes of "ü" (C3 BC); "ð" "Ł" "į" "ķ" are
# the four bytes of "🍕" (F0 9F 8D 95); "¼" alone is a lone continuation byte.
PIECES = ["<eos>", "Ġthe", "Ġd", "Ã", "¼", "ber", "ð", "Ł", "į", "ķ", "ĠÃ", "x"]
EOS = 0


def vocabulary() -> TokenBytes:
    return TokenBytes(FakeTokenizer(PIECES, added={EOS: "<eos>"}), len(PIECES))


def ids(*pieces: str) -> list[int]:
    return [PIECES.index(p) for p in pieces]


def test_unfinished_finds_the_start_of_an_unfinished_character():
    assert unfinished(b"abc") == b""
    assert unfinished("ü".encode()) == b""
    assert unfinished(b"a\xc3") == b"\xc3"
    assert unfinished(b"\xf0\x9f\x8d") == b"\xf0\x9f\x8d"
    assert unfinished("🍕".encode()) == b""
    assert unfinished(b"") == b""


def test_bytes_follow_the_vocabularys_alphabet():
    v = vocabulary()
    assert v.bytes[PIECES.index("Ġthe")] == b" the"
    assert v.bytes[PIECES.index("ĠÃ")] == b" \xc3"
    assert v.pending(ids("Ġd", "Ã")) == b"\xc3" and v.pending(ids("Ġd", "Ã", "¼")) == b""


def test_at_a_character_boundary_a_lone_continuation_byte_may_not_start_and_everything_else_may():
    allowed = vocabulary().allowed(b"")
    assert not allowed[PIECES.index("¼")] and not allowed[PIECES.index("Ł")]
    assert all(allowed[ids("Ġthe", "Ã", "ð", "ĠÃ", "x")]) and allowed[EOS]  # eos may end a finished word


def test_inside_a_character_only_what_continues_it_may_follow():
    v = vocabulary()
    after_c3 = v.allowed(b"\xc3")
    assert torch.nonzero(after_c3).flatten().tolist() == ids("¼", "Ł", "į", "ķ")  # any continuation byte
    after_pizza_start = v.allowed(b"\xf0\x9f")
    assert after_pizza_start[PIECES.index("į")] and not after_pizza_start[EOS]
    assert not after_pizza_start[PIECES.index("Ġthe")]  # a new word may not start inside a character


def test_choose_takes_the_most_probable_allowed_token():
    v = vocabulary()
    logprobs = torch.full((len(PIECES),), -10.0)
    logprobs[PIECES.index("Ġthe")], logprobs[PIECES.index("¼")] = -1.0, -0.5
    assert v.choose(logprobs) == PIECES.index("Ġthe")  # the lone byte is the argmax, but may not start
    assert v.choose(logprobs, v.pending(ids("Ġd", "Ã"))) == PIECES.index("¼")  # ... and may finish "ü"
    restricted = v.restrict(logprobs)
    assert restricted[PIECES.index("¼")] == float("-inf") and restricted[PIECES.index("Ġthe")] == -1.0


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1])
def test_a_real_vocabularys_bytes_spell_what_its_tokenizer_encodes(tiny, which):
    member = tiny.members[which]
    for text in ["Straße, Größe, Übermut", " I love pizza 🍕 because", "日本の首都は", "a\n\nb\tc  d"]:
        encoded = member.tokenisation.tokenizer.encode(text, add_special_tokens=False)
        spelled = b"".join(member.tokenisation.tokens.bytes[i] for i in encoded).decode("utf-8")
        assert spelled.lstrip(" ") == text.lstrip(" ")  # SentencePiece may add or drop a first space


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1])
def test_which_tokens_may_start_is_the_incremental_decoders_answer_for_every_real_token(tiny, which):
    # the slow, obvious rule: a token may start where a strict incremental decoder accepts its bytes so far
    def accepted(data: bytes) -> bool:
        try:
            codecs.getincrementaldecoder("utf-8")("strict").decode(data, final=False)
        except UnicodeDecodeError:
            return False
        return True

    tokens = tiny.members[which].tokenisation.tokens
    expected = torch.tensor([b is None or accepted(b) for b in tokens.bytes])
    assert torch.equal(tokens.can_start, expected)
    assert not expected.all() and expected.any()  # both answers occur in a real vocabulary


def wordpiece_member() -> Member:
    """A real tokenizer of a type the UTF-8 rule does not know (WordPiece, as BERT's), over a tiny random model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {piece: i for i, piece in enumerate(["[UNK]", "[EOS]", "the", "cat", "##s", "sat"])}
    core = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", eos_token="[EOS]")
    shape = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), eos_token_id=1, **shape)).eval()
    return Member("wordpiece", tokenizer, model)


def test_a_vocabulary_of_no_known_type_turns_the_rule_off_with_one_warning_and_a_run_records_it(caplog):
    member = wordpiece_member()
    with caplog.at_level(logging.WARNING, logger="adafuse.text.tokens"):
        assert (
            member.tokenisation.tokens.kind is None and member.tokenisation.tokens.kind is None
        )  # built once for the tokenizer
    warned = [r.getMessage() for r in caplog.records if "UTF-8 rule is off" in r.getMessage()]
    assert len(warned) == 1 and "cannot tell the tokenizer type" in warned[0]
    runtime = {"torch": "2", "models": [{"name": "wordpiece", "device": "cpu", "dtype": "float32", "gpu": None}]}
    record_text_rules(runtime, Ensemble([member]))
    assert runtime["models"][0]["utf8_rule"] == "off"
