"""The server's request checks (serve/protocol.py) on literal bodies, no model: malformed bodies of every shape, how
a request's knobs meet the server's, what a knob's type must be, the words a text is streamed and scored in, and
usage's sums; and the command's warning when it listens beyond the loopback without a key.
tests/integration/test_serve.py sends the refusals to a real server."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from adafuse import AdaFuseConfig
from serve.app import loopback
from serve.protocol import ApiError, Defaults, parse_body, parse_chat, parse_completion, usage, word_logprobs, words
from tests.support.paths import ROOT

SERVER = Defaults(
    model="tiny",
    method="adafuse",
    config=AdaFuseConfig(tau=0.5, branches=1),
    max_tokens=64,
    models=("smollm2_135m", "gemma3_270m"),
    chat=(True, False),
)


def test_a_request_s_knobs_apply_over_the_server_s_and_another_method_starts_from_its_defaults():
    own = parse_completion({"prompt": "Hi", "adafuse": {"max_words": 2}}, SERVER).config
    assert (own.tau, own.branches, own.max_words) == (0.5, 1, 2)
    other = parse_completion({"prompt": "Hi", "adafuse": {"method": "adafuse_code"}}, SERVER).config
    assert type(other).__name__ == "AdaFuseCodeConfig"
    single = parse_completion({"prompt": "Hi", "adafuse": {"method": "single", "member": 1}}, SERVER)
    assert single.used == (1,) and single.reserve == 16  # single's positions: the budget (default 16)


@pytest.mark.parametrize(
    "knobs, field",
    [
        ({"tau": True}, "adafuse.tau"),  # a JSON boolean is no number
        ({"branches": 2.5}, "adafuse.branches"),
        ({"fixed_words": "two"}, "adafuse.fixed_words"),
        ({"method": "single", "member": 2}, "adafuse"),  # the pair has two models
        ({"method": 3}, "adafuse.method"),
    ],
)
def test_a_knob_of_the_wrong_type_or_range_is_refused_naming_it(knobs, field):
    with pytest.raises(ApiError) as refused:
        parse_completion({"prompt": "Hi", "adafuse": knobs}, SERVER)
    assert (refused.value.status, refused.value.param) == (400, field)


def test_a_prompt_s_shared_prefix_is_its_text_through_its_last_blank_line():
    prompt = "Answer briefly.\n\nQ: one?\nA: 1\n\nQ: two?\nA:"
    (request,) = parse_completion({"prompt": prompt, "stop": "\n"}, SERVER).requests
    assert request.prefix == "Answer briefly.\n\nQ: one?\nA: 1\n\n" and request.stop == ("\n",)


def test_chat_needs_every_model_the_method_uses_to_render_a_chat_template():
    message = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    with pytest.raises(ApiError, match="gemma3_270m reads plain text"):
        parse_chat(message, SERVER)
    alone = parse_chat(message | {"adafuse": {"method": "single", "member": 0}}, SERVER)
    assert alone.requests[0].prompt == "Hi" and alone.requests[0].max_new_tokens == SERVER.max_tokens


def test_a_chat_takes_system_messages_before_its_user_message_and_refuses_several_turns():
    alone = {"adafuse": {"method": "single", "member": 0}}
    user = {"role": "user", "content": "Hi"}
    system = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]},
    ]
    (request,) = parse_chat({"messages": [*system, user]} | alone, SERVER).requests
    assert (request.prompt, request.prompt.system) == ("Hi", "Be brief.\n\nBe kind.")
    turns = [user, {"role": "assistant", "content": "Hello."}, user]
    for messages in (turns, [user, system[0]], [*system[:1], {"role": "system", "content": ""}, user]):
        with pytest.raises(ApiError, match="one user message, after any system messages|content must be non-empty"):
            parse_chat({"messages": messages} | alone, SERVER)


def test_words_join_back_to_the_text_and_are_scored_after_everything_before_them():
    text = " Paris.\n\nThe  capital "
    assert words(text) == [" Paris.", "\n\nThe", "  capital", " "] and "".join(words(text)) == text
    pieces, offsets, pairs = word_logprobs("Q: where?\nA:", " Paris, France")
    assert pieces == [" Paris,", " France"] and offsets == [0, 7]
    assert pairs == [("Q: where?\nA:", " Paris,"), ("Q: where?\nA: Paris,", " France")]


def test_usage_sums_each_model_s_own_tokens():
    generations = [SimpleNamespace(stats=SimpleNamespace(tokens_generated=[3, 4]))] * 2
    counts = usage(SERVER.models, (0, 1), [[10, 11], [12, 13]], generations)
    assert counts["models"] == [
        {"name": "smollm2_135m", "prompt_tokens": 22, "completion_tokens": 6},
        {"name": "gemma3_270m", "prompt_tokens": 24, "completion_tokens": 8},
    ]
    assert (counts["prompt_tokens"], counts["completion_tokens"], counts["total_tokens"]) == (46, 14, 60)


@pytest.mark.parametrize(
    "body, phrase",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),  # the parser's recursion ends before the body does
        (b'{"prompt": "Hi", "max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON: Exceeds the limit"),
        (b'{"prompt": "caf\xe9"}', "not valid JSON"),  # Latin-1, not UTF-8
        (b'{"prompt": "Hi",}', "not valid JSON"),
        (b"", "not valid JSON"),
    ],
)
def test_a_malformed_body_of_any_shape_is_a_400_that_says_why(body, phrase):
    with pytest.raises(ApiError) as refused:
        parse_body(body)
    assert refused.value.status == 400 and phrase in refused.value.message


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "Hi \ud800 there"}, "prompt"),  # half a surrogate pair: JSON spells it, no model reads it
        ({"prompt": ["fine", "\udfff"]}, "prompt"),
        ({"prompt": "Hi", "stop": ["\ud83d"]}, "stop"),
    ],
)
def test_text_that_is_not_unicode_is_refused_naming_its_field(body, field):
    parsed = parse_body(json.dumps(body).encode())  # as JSON spells them: \\ud800
    with pytest.raises(ApiError, match="is not Unicode text: surrogates not allowed") as refused:
        parse_completion(parsed, SERVER)
    assert (refused.value.status, refused.value.param) == (400, field)


def test_the_loopback_is_told_from_every_other_address():
    assert all(map(loopback, ["127.0.0.1", "127.0.0.53", "::1", "localhost"]))
    assert not any(map(loopback, ["0.0.0.0", "::", "10.1.2.3", "node17.cluster"]))


@pytest.mark.parametrize(
    "args, env, warned",
    [
        (["--host", "0.0.0.0"], {}, True),
        (["--host", "0.0.0.0", "--api-key", "k"], {}, False),
        (["--host", "0.0.0.0"], {"ADAFUSE_API_KEY": "k"}, False),
        (["--host", "127.0.0.1"], {}, False),
    ],
)
def test_the_server_warns_at_start_when_it_listens_beyond_the_loopback_without_a_key(args, env, warned):
    """Before it loads anything: here it then stops at the pair it cannot find."""
    clean = {k: v for k, v in os.environ.items() if k != "ADAFUSE_API_KEY"} | env
    done = subprocess.run(
        [sys.executable, "-m", "serve", *args, "--pair", "no_such_pair"],
        cwd=ROOT, capture_output=True, text=True, env=clean, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "unknown model pair 'no_such_pair'" in done.stderr, done.stderr
    assert ("without an API key" in done.stderr) == warned, done.stderr
