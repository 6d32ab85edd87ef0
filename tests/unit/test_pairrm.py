"""LLM-Blender's PairRM path on a tiny, randomly initialised DeBERTa-v2 (PairRM itself is a hub download).

Both published checkpoint layouts are built here from a config: llm-blender/PairRM's (a ranker config
that names its backbone) and llm-blender/PairRM-hf's (a DeBERTa-v2 config with the prefix-token ids).
"""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DebertaV2Config, DebertaV2Model, DebertaV2Tokenizer

from adafuse.errors import ConfigError, ModelFileError
from baselines.pairrm import (
    CANDIDATE1,
    CANDIDATE2,
    SOURCE,
    check_pairrm_path,
    load_pairrm,
    scores_from_matrix,
)
from tests.support.pairrm_checkpoint import write_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairrm")
    write_checkpoint(root / "hf", "hf")
    write_checkpoint(root / "ranker", "ranker")
    return root


def test_scores_from_matrix_counts_both_orders():
    c = torch.tensor([[0.0, 2.0, -1.0], [1.0, 0.0, 0.5], [3.0, -2.0, 0.0]])
    # score_i = mean_{j != i} (C[i, j] - C[j, i])
    assert scores_from_matrix(c) == pytest.approx(
        [((2 - 1) + (-1 - 3)) / 2, ((1 - 2) + (0.5 + 2)) / 2, ((3 + 1) + (-2 - 0.5)) / 2]
    )
    assert scores_from_matrix(torch.zeros(1, 1)) == [0.0]


@pytest.mark.parametrize("layout", ["hf", "ranker"])
def test_both_layouts_load_and_read_the_prefix_tokens(checkpoints, layout):
    ranker = load_pairrm(str(checkpoints / layout))
    tok = ranker.tokenizer
    ids = ranker.pair_ids("What is the capital of France?", " Paris", " Lyon [SEP] <|source|>")
    cls, sep = tok.cls_token_id, tok.sep_token_id
    src, c1, c2 = (tok.convert_tokens_to_ids(t) for t in (SOURCE, CANDIDATE1, CANDIDATE2))
    assert ranker.marks == (src, c1, c2)
    # [CLS]<|source|>prompt[SEP][CLS]<|candidate1|>a[SEP][CLS]<|candidate2|>b[SEP], each prefix exactly once
    assert ids[:2] == [cls, src] and ids[-1] == sep
    first, second = ids.index(c1), ids.index(c2)
    assert ids[first - 2 : first] == [sep, cls] and ids[second - 2 : second] == [sep, cls]
    assert ids.count(src) == ids.count(c1) == ids.count(c2) == 1 and ids.count(sep) == 3
    assert tok.decode(ids[first + 1 : second - 2]).strip() == "Paris"


def expected_matrix(directory, source: str, answers: list[str]) -> torch.Tensor:
    """PairRM's comparison matrix written out from the checkpoint's files, without baselines/pairrm.py: the
    saved tokenizer encodes [CLS]<|source|>prompt[SEP][CLS]<|candidate1|>a[SEP][CLS]<|candidate2|>b[SEP];
    a plain transformers DebertaV2Model holds the encoder's weights; the head is
    MLP([h_source; h_first]) - MLP([h_source; h_second]) with MLP = Linear, tanh, Linear from the saved tensors."""
    tok = DebertaV2Tokenizer.from_pretrained(directory)
    state = load_file(directory / "model.safetensors")
    encoder = DebertaV2Model(DebertaV2Config.from_dict(json.loads((directory / "config.json").read_text())))
    prefix = "pretrained_model."
    encoder.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    encoder.eval()

    def mlp(x):
        hidden = torch.tanh(F.linear(x, state["head_layer.1.weight"], state["head_layer.1.bias"]))
        return F.linear(hidden, state["head_layer.4.weight"], state["head_layer.4.bias"])

    n = len(answers)
    expected = torch.zeros(n, n)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            parts = [tok("<|source|>" + source)["input_ids"]]
            parts += [tok("<|candidate1|>" + answers[i])["input_ids"], tok("<|candidate2|>" + answers[j])["input_ids"]]
            marks = [sum(len(p) for p in parts[:k]) + 1 for k in range(3)]  # each part opens [CLS] prefix
            with torch.inference_mode():
                h = encoder(input_ids=torch.tensor([sum(parts, [])])).last_hidden_state[0]
                expected[i, j] = (
                    mlp(torch.cat([h[marks[0]], h[marks[1]]])) - mlp(torch.cat([h[marks[0]], h[marks[2]]]))
                )[0]
    return expected


def test_matrix_holds_every_ordered_pair_as_the_checkpoint_computes_it(checkpoints):
    ranker = load_pairrm(str(checkpoints / "hf"))
    source, answers = "What is the capital of France?", [" Paris", " Lyon", " Berlin is the answer"]
    matrix = ranker.compare(source, answers)  # the pairs in one padded batch
    expected = expected_matrix(checkpoints / "hf", source, answers)  # each pair alone, unpadded
    assert matrix.shape == (3, 3) and matrix.diagonal().abs().max() == 0
    assert torch.allclose(matrix, expected, atol=1e-5), (matrix, expected)
    assert expected.abs().max() > 1e-3  # a random head does not answer 0 everywhere
    assert matrix[0, 1] != -matrix[1, 0]  # a random model has a position bias, which both orders cancel
    scores, again = ranker.scores(source, answers)
    assert torch.equal(again, matrix)
    # score_i = mean_{j != i} (C[i, j] - C[j, i]), from the expected matrix
    assert scores == pytest.approx(
        [float(sum(expected[i, j] - expected[j, i] for j in range(3) if j != i)) / 2 for i in range(3)], abs=1e-5
    )


def test_identical_answers_score_equally(checkpoints):
    ranker = load_pairrm(str(checkpoints / "ranker"))
    scores, matrix = ranker.scores("Q?", [" Paris", " Lyon", " Paris"])
    assert matrix[0, 2].item() == pytest.approx(matrix[2, 0].item(), abs=1e-5)
    assert scores[0] == pytest.approx(scores[2], abs=1e-5)


@pytest.mark.parametrize(
    "files, message",
    [
        ({}, "holds no config.json"),
        ({"config.json": "{not json"}, "not valid JSON"),
        ({"config.json": json.dumps({"model_type": "llama"})}, "not a PairRM checkpoint"),
        ({"config.json": json.dumps({"model_type": "deberta-v2"})}, "not a PairRM checkpoint"),
        ({"config.json": json.dumps({"ranker_type": "summareranker"})}, "not a PairRM"),
        ({"config.json": json.dumps({"ranker_type": "pairranker"})}, "holds no weights"),
    ],
    ids=["empty", "bad-json", "llama", "plain-deberta", "other-ranker", "no-weights"],
)
def test_a_directory_without_a_pairrm_checkpoint_is_refused(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message):
        check_pairrm_path(str(tmp_path))
    with pytest.raises(ConfigError, match=message):
        load_pairrm(str(tmp_path))


def test_weights_of_another_model_are_refused(tmp_path, checkpoints):
    write_checkpoint(tmp_path / "other", "hf")
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, tmp_path / "other" / "model.safetensors")
    with pytest.raises(ConfigError, match="not a PairRM checkpoint"):
        load_pairrm(str(tmp_path / "other"))


def test_missing_local_path_and_unreachable_hub_id(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no such directory"):
        check_pairrm_path(str(tmp_path / "nowhere"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_pairrm_path("llm-blender/PairRM")  # a hub id is checked when it is downloaded
    with pytest.raises(ModelFileError, match="could not be downloaded"):
        load_pairrm("no-such-owner/no-such-pairrm")
