"""Every method on the paper's pair in shape (real Llama 3.1 and Mistral v3 tokenizers, tiny random
weights): in float32 each agrees with its slow cache-free reference, and in bfloat16 (the dtype the
paper's configs load) each runs; no output holds a control token or bytes that are not text.

Random weights make the members produce every kind of token, Llama 3's lone bytes included, which
real models seldom do: that is what exercises the rule that text stays Unicode (adafuse/text/tokens.py)."""

import pytest
import torch

from adafuse import AdaFuseConfig, Ensemble, SingleConfig
from adafuse.config import ModelConfig
from adafuse.text.words import REPLACEMENT
from baselines.deepen import DeepenConfig
from baselines.llm_blender import LLMBlenderConfig
from baselines.sweetspan import SweetSpanConfig
from baselines.unite import UniteConfig
from oracles.agreement import assert_adafuse_agrees, exercised
from oracles.deepen import assert_deepen_agrees
from oracles.fast import decode
from oracles.greedy import hf_greedy
from oracles.llm_blender import assert_llm_blender_agrees
from oracles.sweetspan import assert_sweetspan_agrees
from oracles.unite import slow_unite
from tests.support.paper_pair import NAMES

pytestmark = pytest.mark.slow

# (prompt, stop strings, budget): prompts that end in a space, "\n" and "\n\n"; digits, umlauts, an
# emoji; literal control-token text of both tokenizers.
PROMPTS = [
    ("Write one sentence about a cat.\nSentence: ", [], 12),
    ("List three colors:\n", [], 12),
    ("Question: Name three German cities.\nAnswer:\n\n", [], 12),
    ("1, 2, 3, 4,", [], 10),
    ("Straße, Größe, Übermut und", [], 10),
    ("I love pizza 🍕 because", [], 10),
    ("[INST] What is 2+2? [/INST]", ["\n"], 10),
    ("The tokens </s> and <|eot_id|> are", [], 10),
]
DEEPEN = dict(max_anchors=2000, support=512)


@pytest.fixture(scope="module")
def paper_pair_bf16(paper_pair_dir):
    return Ensemble.from_config([ModelConfig(name=n, path=str(paper_pair_dir / n), dtype="bfloat16") for n in NAMES])


def test_adafuse_agrees_with_the_reference(paper_pair):
    rounds = foreign = 0
    for prompt, stop, budget in PROMPTS:
        gen = assert_adafuse_agrees(paper_pair.members, prompt, stop, budget, AdaFuseConfig())
        counts = exercised(gen)
        rounds, foreign = rounds + counts[0], foreign + counts[1]
    assert rounds >= 2 * len(PROMPTS) and foreign >= 1


def test_unite_agrees_with_the_reference(paper_pair):
    for prompt, stop, budget in PROMPTS:
        gen = decode(paper_pair.members, prompt, UniteConfig(), stop=stop, max_new_tokens=budget)
        text, reason, ids = slow_unite(paper_pair.members, prompt, 10, [0.5, 0.5], stop, budget)
        assert (gen.text, gen.stats.stop_reason, gen.ids) == (text, reason, ids), prompt


@pytest.mark.parametrize("main", [0, 1], ids=["llama_main", "mistral_main"])
def test_deepen_agrees_with_the_reference(paper_pair, main, tmp_path):
    cfg = DeepenConfig(main=main, cache_dir=str(tmp_path), **DEEPEN)
    for prompt, stop, budget in PROMPTS[:4]:
        assert_deepen_agrees(paper_pair.members, prompt, cfg, stop, budget)


def test_sweetspan_agrees_with_the_reference(paper_pair):
    for prompt, stop, budget in PROMPTS:
        assert_sweetspan_agrees(paper_pair.members, prompt, stop, budget, SweetSpanConfig())


def test_llm_blender_agrees_with_the_reference(paper_pair):
    for prompt, stop, budget in PROMPTS:
        assert_llm_blender_agrees(paper_pair.members, prompt, stop, budget)


@pytest.mark.parametrize("index", [0, 1], ids=NAMES)
def test_single_equals_generate(paper_pair, index):
    member = paper_pair.members[index]
    for prompt, _, budget in PROMPTS:
        ours = decode(paper_pair.members, prompt, SingleConfig(index), max_new_tokens=budget)
        assert ours.ids[0] == hf_greedy(member, prompt, budget), prompt


METHODS = [
    AdaFuseConfig(),
    AdaFuseConfig(diversity=False),
    UniteConfig(),
    DeepenConfig(**DEEPEN),
    SweetSpanConfig(),
    LLMBlenderConfig(),
    SingleConfig(0),
    SingleConfig(1),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_method_writes_text_and_no_control_token(paper_pair, paper_pair_bf16, dtype, tmp_path):
    """`single` and LLM-Blender output a model's own greedy answer, which is generate()'s: where a model
    chose bytes that are not text, its text holds what the tokenizer decodes them to (U+FFFD), as
    generate()'s does. Every method that builds shared text keeps it Unicode."""
    pair = paper_pair if dtype == "float32" else paper_pair_bf16
    assert {m.model.dtype for m in pair.members} == {getattr(torch, dtype)}
    for cfg in METHODS:
        if isinstance(cfg, DeepenConfig):
            cfg.cache_dir = str(tmp_path)
        for prompt, stop, budget in PROMPTS:
            gen = decode(pair.members, prompt, cfg, stop=stop, max_new_tokens=budget)
            if not isinstance(cfg, SingleConfig | LLMBlenderConfig):
                assert REPLACEMENT not in gen.text, (type(cfg).__name__, prompt, gen.text)
            if not isinstance(cfg, SingleConfig):  # `single` keeps them in its ids, as generate() does
                used = pair.members
                assert not any(set(ids) & m.tokenisation.control_ids for m, ids in zip(used, gen.ids)), (cfg, prompt)
            for m in pair.members:
                assert not any(
                    m.tokenisation.tokenizer.decode([c]) in gen.text
                    for c in m.tokenisation.control_ids
                    if c > 127999 or c < 11
                )
