"""A trace holds enough to recompute every score with a plain, cache-free forward pass (spec §7); on the
paper's pair in shape (what is checked is the record, not the models: the real pair's scores are checked
against the cache-free reference in tests/engine/test_reference_agreement.py)."""

import json

import pytest

from adafuse import AdaFuseConfig
from oracles import reference
from oracles.fast import decode

pytestmark = pytest.mark.slow


def test_every_traced_score_recomputes_from_a_cache_free_forward(paper_pair):
    models = [reference.RefModel(m) for m in paper_pair.members]
    prompt = "Question: In which city is the Brandenburg Gate?\nAnswer:"
    gen = decode(paper_pair.members, prompt, AdaFuseConfig(), stop=["\n"], max_new_tokens=12, trace=True)
    checked = 0
    for contexts, rnd in zip(gen.trace.contexts(), gen.trace.rounds):
        assert len(rnd.models) == len(models)
        for c in rnd.candidates:
            for k, (model, score) in enumerate(zip(models, c.scores)):
                assert score.base <= len(contexts[k])
                nll = reference.nll(model, contexts[k][: score.base], score.ids, score.eos, score.skip)
                assert score.nll == pytest.approx(nll, abs=1e-4)
                checked += 1
            assert c.fused == pytest.approx(sum(s.nll for s in c.scores) / len(models), abs=1e-6)
        assert rnd.winner == min(range(len(rnd.candidates)), key=lambda i: rnd.candidates[i].fused)
    assert checked >= 4
    last_contexts = list(gen.trace.contexts())[-1]  # replaying every winner gives each model's final context
    last = gen.trace.rounds[-1].candidates[gen.trace.rounds[-1].winner]
    for k, score in enumerate(last.scores):
        final = last_contexts[k][: score.base] + score.ids
        assert final[len(gen.trace.prompt_ids[k]) :] == gen.ids[k]
    json.dumps(gen.to_dict())  # the whole record serialises
