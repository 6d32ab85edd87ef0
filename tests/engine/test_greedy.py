"""method=single must equal transformers' own greedy decode() token for token."""

import copy

import pytest

from adafuse import ChatPrompt, SingleConfig
from adafuse.text.words import REPLACEMENT
from oracles.fast import decode
from oracles.greedy import hf_greedy
from tests.support.prompts import nq_prompt

pytestmark = pytest.mark.slow

PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "The sum of 128 and 256 is",
    "Die Hauptstadt von Deutschland ist",
    "List three colors:\n",
    "日本の首都は",
    "I love pizza 🍕 because",
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nLet's think step by step\n",
    "def add(a, b):\n    return",
]


# The real models read a stop-string question, CJK and a reasoning chain; their stand-ins in shape (conftest
# `tiny_shaped`: the same tokenizers, eos sets and architectures) read every prompt.
ON_THE_REAL_PAIR = [PROMPTS[0], PROMPTS[4], PROMPTS[6]]


@pytest.mark.parametrize("index", [0, 1], ids=["smollm2", "gemma3"])
def test_single_equals_generate_token_for_token(tiny, tiny_shaped, index):
    for members, prompts in [(tiny.members, ON_THE_REAL_PAIR), (tiny_shaped, PROMPTS)]:
        member = members[index]
        for prompt in prompts:
            ours = decode(members, prompt, SingleConfig(member=index), max_new_tokens=12)
            assert ours.ids[0] == hf_greedy(member, prompt, 12), (member.name, prompt)
            # The text is the ids' text without control tokens (a random model emits Gemma's <unusedN>), less
            # a character the budget cut part-way through.
            shown = [t for t in ours.ids[0] if t not in member.tokenisation.control_ids]
            assert ours.text == member.text_of(shown, member.tokenisation.encode(prompt)).removesuffix(REPLACEMENT)


def test_single_stops_at_stop_strings_and_eos(tiny, smol):
    prompt = "Question: What is the capital of France?\nAnswer:"
    free = decode(tiny.members, prompt, SingleConfig(1), max_new_tokens=40)
    assert "\nQuestion:" in free.text  # the base model runs on into the next few-shot item
    gen = decode(tiny.members, prompt, SingleConfig(1), stop=["\nQuestion:"], max_new_tokens=40)
    assert gen.stats.stop_reason == "stop"
    assert gen.text == free.text.split("\nQuestion:")[0]
    gen = decode(tiny.members, prompt, SingleConfig(1), max_new_tokens=7)
    assert gen.stats.stop_reason == "length" and len(gen.ids[0]) == 7
    smol_chat = type(smol)(smol.name, smol.tokenisation.tokenizer, smol.model, chat_template=True)
    gen = decode([smol_chat], "What is 2 + 2? Answer with one number.", SingleConfig(0), max_new_tokens=40)
    assert gen.stats.stop_reason == "eos"
    assert gen.ids[0] and gen.ids[0][-1] not in smol.tokenisation.eos_ids


def test_single_keeps_control_tokens_in_its_ids_and_out_of_its_text(tiny, gemma, shared_data):
    """On this NQ question Gemma's greedy output is <start_of_image> repeated (as decode() gives it);
    the prediction leaves control tokens out, as lm-evaluation-harness leaves special tokens out."""
    prompt, stop = nq_prompt(shared_data, "nq-4")
    gen = decode(tiny.members, prompt, SingleConfig(1), stop=stop, max_new_tokens=8, trace=True)
    assert gen.ids[0] == hf_greedy(gemma, prompt, 8)
    shown = [t for t in gen.ids[0] if t not in gemma.tokenisation.control_ids]
    assert len(shown) < len(gen.ids[0])  # control tokens were generated
    assert gen.text == gemma.text_of(shown, gemma.tokenisation.encode(prompt))
    assert "<start_of_image>" not in gen.text
    assert [s.token for s in gen.trace.steps] == gen.ids[0]  # trace=true records every step
    assert "".join(s.text for s in gen.trace.steps) == gen.text


# A template without a system turn, as some models ship (Gemma 2's raises on one).
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


def test_a_system_message_is_read_in_the_models_template_or_before_the_users_where_it_has_no_system_turn(smol):
    """A chat request's system message (adafuse-serve) reaches each model as its own template renders it; single
    then equals transformers' greedy decode of that rendering."""
    question = ChatPrompt("What is 2 + 2?", "Answer with one number.")
    chat = type(smol)(smol.name, smol.tokenisation.tokenizer, smol.model, chat_template=True)
    rendered = chat.tokenisation.render(question)
    expected = [{"role": "system", "content": question.system}, {"role": "user", "content": "What is 2 + 2?"}]
    assert rendered == smol.tokenisation.tokenizer.apply_chat_template(
        expected, tokenize=False, add_generation_prompt=True
    )
    gen = decode([chat], question, SingleConfig(0), max_new_tokens=8)
    assert gen.ids[0] == hf_greedy(chat, rendered, 8)  # the rendering read as it is, no special tokens added

    plain = copy.deepcopy(smol.tokenisation.tokenizer)
    plain.chat_template = NO_SYSTEM
    no_system = type(smol)(smol.name, plain, smol.model, chat_template=True)
    assert no_system.tokenisation.render(question) == (
        "<|im_start|>user\nAnswer with one number.\n\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant"
    )
