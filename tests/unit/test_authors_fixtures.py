"""tools/check_authors_fixtures.py: every recording of the authors' code (tests/fixtures/authors_code/) is rebuilt,
round by round, from BEHAVIOUR.md's rules with the bundled pair's tokenizers alone (proposals, pool, fusion, text
appended, stop rule, `pred`), and a recording that breaks a rule fails the check."""

import json

import pytest

from tools import check_authors_fixtures as fixtures

RECORDINGS = sorted(fixtures.FIXTURES.glob("*.json"))


@pytest.fixture(scope="module")
def checker(tiny):
    """One checker for every file (its tokenizers loaded once); `tiny` makes sure the bundled pair is converted."""
    return fixtures.Checker(models=False)


@pytest.mark.slow
@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda path: path.stem)
def test_each_recording_follows_the_rules_round_by_round(checker, recording):
    before = checker.stats["rounds"]
    checker.check_file(recording)
    assert checker.stats["rounds"] > before


@pytest.mark.slow
def test_a_recording_whose_prediction_breaks_the_rules_fails(checker, tmp_path):
    data = json.loads(RECORDINGS[0].read_text())
    data["examples"][0]["pred"] += " and more"
    broken = tmp_path / RECORDINGS[0].name
    broken.write_text(json.dumps(data))
    with pytest.raises(AssertionError, match="pred"):
        checker.check_file(broken)
