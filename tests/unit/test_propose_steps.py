"""How `propose_all` (adafuse/methods/adafuse.py) steps the models' proposals while a round may still end early
(spec §5, "early finish"): together, one pass each per engine step, a settled model stepping on beside one
that has not settled, never alone after it. The proposals are scripted (the texts their candidates have
before each step, a `Settles` each, then the step's pass); tests/engine/test_reference_agreement.py checks
the real decoder's outputs against the reference."""

from types import SimpleNamespace

import pytest

from adafuse.methods import adafuse as decode
from adafuse.methods.adafuse import RoundEnd, propose_all
from adafuse.methods.completion import Settles


def scripted(steps: list[list[str]], final: list[str], name: str):
    """A proposal whose candidates' texts are steps[i] before step i and `final` once it has ended, reporting
    to its own RoundEnd as `complete_words` does; each step's pass is the request `name`."""

    def proposing(member, cfg, round_idx, ending):
        for texts in steps:
            cuts = [ending.cut(text, False) for text in texts]
            yield Settles(ending.possible and None not in cuts and ending.agree(cuts))
            yield name
        return [SimpleNamespace(text=text) for text in final], name

    return proposing


def run(monkeypatch, scripts: dict[str, tuple[list[list[str]], list[str]]]):
    """propose_all over the scripted models, run as the engine runs it: the passes of each engine step, by model."""
    proposals = {name: scripted(steps, final, name) for name, (steps, final) in scripts.items()}
    monkeypatch.setattr(decode, "proposing", lambda m, cfg, round_idx, ending: proposals[m](m, cfg, round_idx, ending))
    ending = RoundEnd("", ("\n",))
    program, steps, answer = propose_all(list(scripts), None, 0, ending), [], None
    while True:
        try:
            asked = program.send(answer)
        except StopIteration as done:
            return ending, done.value, steps
        steps.append(sorted(asked))
        answer = [None] * len(asked)


def test_a_settled_model_steps_on_beside_one_that_has_not_and_both_stop_when_all_settle(monkeypatch):
    ending, results, rounds = run(
        monkeypatch,
        {
            # settled from its first step: " Paris\n..." is cut at " Paris" whatever follows
            "a": ([[" Paris\n"]] * 5, [" Paris\nQ"]),
            # settles before its third step
            "b": ([[" Par"], [" Paris"], [" Paris\n"], [" Paris\nA"]], [" Paris\nAB"]),
        },
    )
    assert ending.settled and ending.target == " Paris"
    assert results == [None, None]  # neither proposal is finished: the round's text is known
    assert rounds == [["a", "b"], ["a", "b"]]  # the two steps b needed, a beside it each time


def test_when_the_round_cannot_end_early_the_settled_model_has_already_stepped_on(monkeypatch):
    ending, results, rounds = run(
        monkeypatch,
        {
            "a": ([[" Paris\n"]] * 4, [" Paris\nQ"]),
            # ends without a stop: no early finish
            "b": ([[" Lyon"], [" Lyon,"]], [" Lyon,"]),
        },
    )
    assert not ending.settled and not ending.possible
    assert [r[1] for r in results] == ["a", "b"]  # both proposals ran to their end
    # a's steps ran beside b's while b proposed, and only the rest after b had ended
    assert rounds == [["a", "b"], ["a", "b"], ["a"], ["a"]]


@pytest.mark.parametrize("b_final, settles", [([" Paris\nX"], True), ([" Paris!"], False)])
def test_models_that_all_end_within_the_steps_settle_on_their_candidates(monkeypatch, b_final, settles):
    ending, results, _ = run(monkeypatch, {"a": ([[" Paris\n"]], [" Paris\nQ"]), "b": ([[" Par"]], b_final)})
    assert ending.settled == settles
    assert [r[1] for r in results] == ["a", "b"]  # ended: their proposals are kept either way
