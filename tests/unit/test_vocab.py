"""Token bytes (adafuse/text/tokens.py) and vocabulary normalisation (baselines/vocab.py) on small hand-made
vocabularies, and the shared weight checks."""

import pytest

from adafuse.errors import ConfigError
from adafuse.text.tokens import BYTE_LEVEL, SENTENCEPIECE, byte_level_alphabet, detect_type, vocabulary_bytes
from baselines.vocab import Vocabulary, check_weights, member_weights
from tests.support.members import FakeTokenizer


def test_byte_level_alphabet_is_a_bijection_onto_the_256_bytes():
    table = byte_level_alphabet()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == ord(" ") and table["Ċ"] == ord("\n") and table["ĉ"] == ord("\t") and table["a"] == ord("a")


def test_type_is_detected_from_the_markers_not_from_a_name():
    assert detect_type({"Ġthe": 0, "Ġa": 1, "b": 2}) == BYTE_LEVEL
    assert detect_type({"▁the": 0, "▁a": 1, "<0x0A>": 2}) == SENTENCEPIECE
    with pytest.raises(ConfigError, match="cannot tell the tokenizer type"):
        detect_type({"the": 0, "##a": 1})


def test_byte_level_pieces_map_to_their_bytes_and_partial_characters_have_no_text():
    # "ĠÃ" + "¼" is how SmolLM2 spells " ü": each half alone is not a whole character.
    tok = FakeTokenizer(
        ["Ġthe", "Ċ", "ĊĊ", "Ã¼", "ĠÃ", "¼", "Ġ", "<|im_end|>", "<|im_start|>"], {7: "<|im_end|>", 8: "<|im_start|>"}
    )
    v = Vocabulary.build(*vocabulary_bytes(tok, 10), excluded=frozenset({7, 8}))
    assert v.kind == BYTE_LEVEL
    assert v.texts[:4] == [" the", "\n", "\n\n", "ü"]
    assert v.texts[4] is None and v.texts[5] is None and v.partial == {4, 5}
    assert v.texts[7] is None and v.texts[8] is None  # control and eos ids are never text
    assert v.texts[9] is None  # a logit column past the tokenizer's vocabulary
    assert v.bare_space == {6} and v.ids_of("\n") == [1] and v.ids_of(" ü") == []


def test_sentencepiece_pieces_map_spaces_and_byte_fallback():
    pieces = ["<pad>", "▁the", "▁▁", "<0x0A>", "<0xC3>", "▁", "<0x20>", "Ċ", "\n", "\n\n", "ü"]
    tok = FakeTokenizer(pieces, {0: "<pad>", 8: "\n", 9: "\n\n"})
    v = Vocabulary.build(*vocabulary_bytes(tok, len(pieces)), excluded=frozenset({0}))
    assert v.kind == SENTENCEPIECE
    assert v.texts[1:4] == [" the", "  ", "\n"]
    assert v.texts[4] is None and v.partial == {4}  # a lone lead byte of a two-byte character
    assert v.texts[7] == "Ċ"  # in SentencePiece, Ċ is just that letter
    assert v.ids_of("\n") == [3, 8] and v.ids_of("\n\n") == [9]  # added whitespace tokens are literal text
    assert v.bare_space == {5, 6}


def test_digest_changes_with_any_text():
    a = Vocabulary.build(*vocabulary_bytes(FakeTokenizer(["Ġa", "Ġb"]), 2))
    b = Vocabulary.build(*vocabulary_bytes(FakeTokenizer(["Ġa", "Ġc"]), 2))
    again = Vocabulary.build(*vocabulary_bytes(FakeTokenizer(["Ġa", "Ġb"]), 2))
    assert a.digest != b.digest and a.digest == again.digest


@pytest.mark.parametrize("weights", [[0.5, 0.6], [-0.1, 1.1], [0.3, 0.3], [], [float("nan"), 1.0]])
def test_weights_outside_the_simplex_are_refused(weights):
    with pytest.raises(ConfigError, match="weights"):
        check_weights("unite", weights)


def test_weights_default_to_uniform_and_must_match_the_members():
    check_weights("unite", [0.25, 0.75])
    assert member_weights("unite", None, 4) == [0.25] * 4
    with pytest.raises(ConfigError, match="3 weights for 2 members"):
        member_weights("unite", [0.2, 0.3, 0.5], 2)
