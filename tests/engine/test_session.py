"""The Session's API on a real member: the only way a method changes G, the stop reason, the statistics
and the trace (tests/unit/test_seams.py holds every method to it)."""

import pytest

from adafuse.session import Request, Session


def test_a_method_changes_the_session_only_through_its_methods(smol):
    request = Request("Question: Which river flows through Vienna?\nAnswer:", stop="\n", trace=True)
    s = Session([smol], request, reserve=8)
    assert (s.text, s.rounds, s.done, s.tracing) == ("", 0, False, True)
    assert not s.append(" The", words=1) and not s.add(" Danube", words=1)
    assert s.add(" river.\nQuestion:", words=2)  # the stop string cuts G and ends the decode
    s.note(chosen=0)
    s.log("a step")
    with pytest.raises(AttributeError):
        s.text = "rewritten"
    with pytest.raises(ValueError, match="stop reason"):
        s.end("tired")
    gen = s.finish()
    assert gen.text == " The Danube river." and gen.stats.stop_reason == "stop"
    assert gen.stats.rounds == 3 and gen.stats.words_per_round == [1, 1, 2]
    assert gen.stats.notes == {"chosen": 0} and gen.trace.steps == ["a step"]


def test_a_method_with_stop_rules_of_its_own_ends_the_decode_itself(smol):
    s = Session([smol], Request("Question: 2 + 2?\nAnswer:", max_new_tokens=1), reserve=8)
    assert not s.append(" 4 and more")  # no stop string; `append` applies no budget, the method does
    assert not s.done
    s.end("length")
    s.set_output_ids([[7]])
    gen = s.finish()
    assert (gen.text, gen.stats.stop_reason, gen.ids, gen.trace) == (" 4 and more", "length", [[7]], None)


def test_a_solo_session_starts_from_nothing_on_the_same_request(tiny):
    s = Session(tiny.members, Request("Question: 2 + 2?\nAnswer:", trace=True), reserve=8)
    s.add(" 4", eos=True)
    alone = s.solo(1)
    assert alone.members == [tiny.members[1]] and alone.request is s.request
    assert (alone.text, alone.rounds, alone.done) == ("", 0, False)
    assert alone.finish().trace.prompt_ids == [list(tiny.members[1].ids)]
    assert s.text == " 4" and s.done
