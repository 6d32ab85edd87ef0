"""Standard metrics: SQuAD v1.1 EM/F1 by hand, numeric accuracy, and BLEU/chrF against the sacrebleu CLI."""

import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from adafuse.errors import UnknownNameError
from eval.metrics import METRICS, numeric_acc, spbleu_available, spm_model_path, squad_em, squad_f1

# The sacrebleu command line of this interpreter (/work/venv/bin/sacrebleu in our venv).
SACREBLEU_CLI = [sys.executable, "-m", "sacrebleu"]

# Real-looking En->De outputs: a near miss, an empty generation, an exact match, a reordering.
GERMAN_PREDICTIONS = [
    "Der Hund läuft schnell über die Straße.",
    "",
    "Die Katze schläft auf dem Sofa.",
    "Wir haben gestern ein neues Auto gekauft, das sehr schnell ist.",
]
GERMAN_REFERENCES = [
    "Der Hund rennt schnell über die Straße.",
    "Das Wetter ist heute sehr schön.",
    "Die Katze schläft auf dem Sofa.",
    "Gestern haben wir ein neues Auto gekauft, das sehr schnell fährt.",
]
GERMAN_SECOND_REFERENCES = [
    "Der Hund läuft rasch über die Straße.",
    "Heute ist das Wetter sehr schön.",
    "Die Katze schläft auf der Couch.",
    "Wir kauften gestern ein neues, sehr schnelles Auto.",
]


@pytest.mark.parametrize(
    "prediction, answers, em",
    [
        ("the", ["a"], 1.0),  # both normalise to ""
        (".", ["Paris"], 0.0),
        ("the Eiffel Tower", ["Eiffel Tower"], 1.0),
        ("Eiffel Tower!", ["eiffel   tower"], 1.0),
        ("Paris", ["London", "paris."], 1.0),  # max over answers
        ("Paris, France", ["Paris"], 0.0),
    ],
)
def test_squad_em_follows_the_official_normalisation(prediction, answers, em):
    assert squad_em(prediction, answers) == em


@pytest.mark.parametrize(
    "prediction, answers, f1",
    [
        # [cat, sat] vs [cat, sat, on, mat]: P = 2/2, R = 2/4, F1 = 2 * 1 * 0.5 / 1.5
        ("the cat sat", ["cat sat on the mat"], 2 / 3),
        # tokens count with multiplicity: [cat, cat] vs [cat] shares 1, P = 1/2, R = 1
        ("cat cat", ["cat"], 2 / 3),
        # the best of the answers: [cat, sat] vs [cat, sat, down] gives P = 1, R = 2/3, F1 = 0.8
        ("cat sat", ["dog", "the cat sat down"], 0.8),
        ("the", ["a"], 0.0),  # the official script: no shared token, so 0 even though both are empty
        (".", ["Paris"], 0.0),
        ("Paris", ["paris"], 1.0),
    ],
)
def test_squad_f1_is_bag_of_tokens_overlap(prediction, answers, f1):
    assert squad_f1(prediction, answers) == pytest.approx(f1)


def test_em_and_f1_corpus_are_percent_means():
    predictions = ["the Eiffel Tower", "the cat sat", ""]
    references = [["Eiffel Tower"], ["cat sat on the mat"], ["Rome"]]
    assert METRICS["em"].corpus(predictions, references) == pytest.approx(100 / 3)
    assert METRICS["f1"].corpus(predictions, references) == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)


def test_corpus_refuses_misaligned_or_empty_inputs():
    with pytest.raises(ValueError):
        METRICS["em"].corpus(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="no examples"):
        METRICS["acc"].corpus([], [])
    with pytest.raises(ValueError, match="2 predictions but 1"):
        METRICS["bleu"].corpus(["a", "b"], [["a"]])


@pytest.mark.parametrize(
    "prediction, references, acc",
    [
        ("18", ["18.0"], 1.0),
        ("1,000", ["1000"], 1.0),
        ("-3", ["-3.00"], 1.0),
        ("", ["18"], 0.0),
        ("eighteen", ["18"], 0.0),
        ("17", ["18"], 0.0),
        ("18", ["not a number", "18"], 1.0),
    ],
)
def test_acc_is_numeric_equality(prediction, references, acc):
    assert numeric_acc(prediction, references) == acc


def _cli_score(tmp_path: Path, metric: str, reference_streams: list[list[str]], predictions: list[str]) -> str:
    hyp = tmp_path / "hyp.de"
    hyp.write_text("\n".join(predictions) + "\n", encoding="utf-8")
    refs = []
    for k, stream in enumerate(reference_streams):
        refs.append(tmp_path / f"ref{k}.de")
        refs[-1].write_text("\n".join(stream) + "\n", encoding="utf-8")
    command = [*SACREBLEU_CLI, *map(str, refs), "-i", str(hyp), "-m", metric, "-b", "-w", "2"]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_corpus_score_equals_the_sacrebleu_cli(tmp_path, metric):
    references = [[ref] for ref in GERMAN_REFERENCES]
    ours = METRICS[metric].corpus(GERMAN_PREDICTIONS, references)
    assert f"{ours:.2f}" == _cli_score(tmp_path, metric, [GERMAN_REFERENCES], GERMAN_PREDICTIONS)
    assert 0 < ours < 100


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_multiple_references_are_transposed_into_streams(tmp_path, metric):
    references = [list(pair) for pair in zip(GERMAN_REFERENCES, GERMAN_SECOND_REFERENCES)]
    ours = METRICS[metric].corpus(GERMAN_PREDICTIONS, references)
    streams = [GERMAN_REFERENCES, GERMAN_SECOND_REFERENCES]
    assert f"{ours:.2f}" == _cli_score(tmp_path, metric, streams, GERMAN_PREDICTIONS)
    single = METRICS[metric].corpus(GERMAN_PREDICTIONS, [[ref] for ref in GERMAN_REFERENCES])
    assert ours >= single  # a second reference can only add matches


def test_unequal_reference_counts_are_refused():
    with pytest.raises(ValueError, match="same number of references"):
        METRICS["bleu"].corpus(["a", "b"], [["a"], ["b", "c"]])


def test_an_empty_prediction_is_scored_not_dropped():
    with_empty = METRICS["bleu"].corpus(GERMAN_PREDICTIONS, [[ref] for ref in GERMAN_REFERENCES])
    kept = [0, 2, 3]
    without_row = METRICS["bleu"].corpus([GERMAN_PREDICTIONS[i] for i in kept], [[GERMAN_REFERENCES[i]] for i in kept])
    assert with_empty < without_row
    assert METRICS["bleu"].per_example("", ["Das Wetter ist heute sehr schön."]) == 0.0


def test_sentence_scores_are_sacrebleus():
    pred, ref = GERMAN_PREDICTIONS[0], GERMAN_REFERENCES[0]
    assert METRICS["bleu"].per_example(pred, [ref]) == pytest.approx(sacrebleu.sentence_bleu(pred, [ref]).score)
    assert METRICS["chrf"].per_example(pred, [ref]) == pytest.approx(sacrebleu.sentence_chrf(pred, [ref]).score)
    assert METRICS["bleu"].per_example(GERMAN_PREDICTIONS[2], [GERMAN_REFERENCES[2]]) == pytest.approx(100)


def test_spbleu_refuses_to_download_its_model(tmp_path, monkeypatch):
    monkeypatch.setattr(sacrebleu.utils, "SACREBLEU_DIR", str(tmp_path))
    assert not spbleu_available()
    assert spm_model_path() == str(tmp_path / "models" / "sacrebleu_tokenizer_spm.model")
    with pytest.raises(FileNotFoundError, match="sacrebleu_tokenizer_spm.model"):
        METRICS["spbleu"].corpus(GERMAN_PREDICTIONS, [[ref] for ref in GERMAN_REFERENCES])
    with pytest.raises(FileNotFoundError):
        METRICS["spbleu"].per_example(GERMAN_PREDICTIONS[0], [GERMAN_REFERENCES[0]])
    assert not (tmp_path / "models").exists()


def test_registry_misses_suggest_close_names():
    assert {"em", "f1", "acc", "bleu", "chrf", "spbleu"} <= set(METRICS)
    assert not any(METRICS[name].raw for name in ("em", "f1", "acc", "bleu", "chrf", "spbleu"))
    with pytest.raises(UnknownNameError, match="bleu"):
        METRICS["blue"]


@pytest.mark.parametrize("name", ["bleu", "chrf", "spbleu"])
@pytest.mark.parametrize(
    "draw", [[0, 1, 2, 3], [3, 3, 0, 1], [2, 2, 2, 2], [1, 0]], ids=["as-is", "repeats", "one-row", "two-rows"]
)
def test_a_corpus_score_of_a_resample_is_the_score_of_its_examples_summed_statistics(name, draw):
    """What tables and reports resample through (eval/bootstrap.py): the same bits as the corpus score itself."""
    if name == "spbleu" and not spbleu_available():
        pytest.skip(f"spBLEU's SentencePiece model is not at {spm_model_path()} (scripts/prepare_data.py fetches it)")
    references = [list(refs) for refs in zip(GERMAN_REFERENCES, GERMAN_SECOND_REFERENCES)]
    metric = METRICS[name]
    statistics, score_of = metric.statistics(GERMAN_PREDICTIONS, references)
    resampled = metric.corpus([GERMAN_PREDICTIONS[i] for i in draw], [references[i] for i in draw])
    assert score_of(statistics[draw].sum(axis=0).tolist()) == resampled
