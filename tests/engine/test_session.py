"""The Session's API on a real member: the only way a method changes G, the stop reason, the statistics
and the trace (tests/unit/test_seams.py holds every method to it); its members read the prompt in one engine step."""

import threading

import pytest
import torch

from adafuse.backend.cpu.backend import CpuBackend
from adafuse.engine.executor import Executor
from adafuse.engine.loop import drive
from adafuse.ensemble import cpu_options, resolve_method
from adafuse.methods.session import Request, Session


def test_a_method_changes_the_session_only_through_its_methods(smol):
    request = Request("Question: Which river flows through Vienna?\nAnswer:", stop="\n", trace=True)
    s = Session([smol], request, reserve=8)
    drive(s.start())
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
    drive(s.start())
    s.add(" 4", eos=True)
    alone = s.solo(1)
    assert alone.members == [tiny.members[1]] and alone.request is s.request
    assert (alone.text, alone.rounds, alone.done) == ("", 0, False)
    assert alone.finish().trace.prompt_ids == [list(tiny.members[1].ids)]
    assert s.text == " 4" and s.done


def test_unbatched_members_read_in_the_same_step_and_their_passes_run_side_by_side(tiny, monkeypatch):
    """Unbatched, AdaFuse's members ask for their passes in the same engine step, and on the CPU the second
    member's passes run on a thread of their own (adafuse/backend/cpu/__init__.py); the generation (text, ids, every
    score of the trace) is the one of running every pass on the engine's thread."""
    prompt = "Question: What is the capital of France?\nAnswer:"
    threads = {m.name: set() for m in tiny.members}
    names, run = {id(m.model): m.name for m in tiny.members}, CpuBackend.run

    def spy(self, p, context):
        threads[names[id(p.model.model)]].add(threading.get_ident())
        return run(self, p, context)

    monkeypatch.setattr(CpuBackend, "run", spy)
    tiny.decode(prompt, max_new_tokens=1)  # both runs below then find the prompt stored, and read its last token
    spec, cfg = resolve_method("adafuse", {})
    request = Request(prompt, ("\n",), 8, trace=True)
    side_by_side = drive(spec.generate(tiny.members, request, cfg))
    smol_threads, gemma_threads = threads.values()
    if torch.get_num_threads() > 1:  # the first model's passes run on the engine's thread, the other's beside
        assert smol_threads == {threading.get_ident()} and gemma_threads - {threading.get_ident()}
    one_thread = drive(spec.generate(tiny.members, request, cfg), Executor(options=cpu_options(side_by_side=False)))
    assert (side_by_side.text, side_by_side.ids) == (one_thread.text, one_thread.ids)
    assert [[c.scores for c in r.candidates] for r in side_by_side.trace.rounds] == [
        [c.scores for c in r.candidates] for r in one_thread.trace.rounds
    ]


def test_on_text_hears_each_final_start_of_g_and_all_of_it_at_the_end(smol):
    """A stop string of 10 characters may still cut the last 9 characters of G: those are held back until
    decoding ends. A solo session (LLM-Blender's member answers) tells the listener nothing."""
    heard = []
    s = Session([smol], Request("Question: 2 + 2?\nAnswer:", stop="\nQuestion:"), reserve=8, on_text=heard.append)
    s.add(" Four")
    assert heard == []  # 5 characters, every one of them still inside a possible stop string
    s.add(" is the answer.\n")
    assert heard == [" Four is the"]  # 21 characters, the last 9 held back
    alone = s.solo(0)
    alone.add(" anything at all", eos=True)
    assert heard == [" Four is the"]
    assert s.add("Question: and more")  # the stop string cuts G inside what was held back
    assert heard == [" Four is the", " Four is the answer."] and s.text == heard[-1]


def test_on_text_during_a_real_decode_ends_with_the_generated_text(tiny):
    heard = []
    spec, cfg = resolve_method("adafuse", {})
    request = Request("Question: What is the capital of France?\nAnswer:", ("\n",), 12)
    gen = drive(spec.generate(tiny.members, request, cfg, on_text=heard.append))
    assert heard and heard[-1] == gen.text
    assert all(later.startswith(earlier) and later != earlier for earlier, later in zip(heard, heard[1:]))
    assert gen.text == tiny.decode(request).text  # a listener changes nothing it hears
