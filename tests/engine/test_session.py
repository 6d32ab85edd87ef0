"""The Session's API on a real member: the only way a method changes G, the stop reason, the statistics
and the trace (tests/unit/test_seams.py holds every method to it)."""

import os
import signal
import threading
import time

import pytest

from adafuse import session
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


def test_unbatched_members_propose_and_score_on_threads_of_their_own(tiny, monkeypatch):
    """Unbatched, AdaFuse's members run side by side (`side_by_side`): the second member's passes run on a
    thread of its own, and the generation (text, ids, every score of the trace) is the one of running them in turn."""
    prompt = "Question: What is the capital of France?\nAnswer:"
    threads = {m.name: set() for m in tiny.members}
    for m in tiny.members:
        forward = m.forward_alone

        def spy(*args, _forward=forward, _name=m.name, **kwargs):
            threads[_name].add(threading.get_ident())
            return _forward(*args, **kwargs)

        monkeypatch.setattr(m, "forward_alone", spy)
    tiny.decode(prompt, max_new_tokens=1)  # both runs below then find the prompt stored, and read its last token
    together = tiny.decode(prompt, stop=["\n"], max_new_tokens=8, trace=True)
    smol_threads, gemma_threads = threads.values()
    # the first task runs on the caller; a task alone (one member left to finish its proposal) too
    assert smol_threads == {threading.get_ident()} and gemma_threads - {threading.get_ident()}
    monkeypatch.setattr(session, "side_by_side", lambda tasks: [task() for task in tasks])
    in_turn = tiny.decode(prompt, stop=["\n"], max_new_tokens=8, trace=True)
    assert (together.text, together.ids) == (in_turn.text, in_turn.ids)
    assert [[c.scores for c in r.candidates] for r in together.trace.rounds] == [
        [c.scores for c in r.candidates] for r in in_turn.trace.rounds
    ]


def test_side_by_side_runs_tasks_at_once_returns_in_order_and_raises_the_first_error_last():
    meet = threading.Barrier(3, timeout=10)  # passes only if three tasks wait at the same time
    assert session.side_by_side([lambda i=i: meet.wait() is not None and i for i in range(3)]) == [0, 1, 2]
    ended = []

    def failing(message):
        time.sleep(0.05)
        ended.append(message)
        raise ValueError(message)

    with pytest.raises(ValueError, match="first"):
        session.side_by_side([lambda: failing("first"), lambda: failing("second"), lambda: ended.append("ok")])
    assert sorted(ended) == ["first", "ok", "second"]  # every task ended before the error was raised


def test_a_task_that_runs_tasks_side_by_side_runs_them_in_turn():
    """No pool thread ever waits for another: nested tasks run on the thread that asked for them."""
    outer = session.side_by_side(
        [lambda: session.side_by_side([threading.get_ident, threading.get_ident]) for _ in range(8)]
    )
    assert all(len(set(inner)) == 1 for inner in outer)


def test_a_forked_child_runs_tasks_side_by_side_on_threads_of_its_own():
    """A child forked after the parent ran tasks side by side has none of the parent's threads: it must not
    hand its tasks to them (they would never run)."""
    assert session.side_by_side([lambda: 1, lambda: 2]) == [1, 2]
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if two tasks met at once on its own threads
        try:
            meet = threading.Barrier(2, timeout=10)
            os._exit(0 if session.side_by_side([meet.wait, meet.wait]) is not None else 1)
        except BaseException:
            os._exit(1)
    deadline = time.monotonic() + 30
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child's tasks never ran: they waited for threads it does not have")
    assert os.waitstatus_to_exitcode(waited[1]) == 0
