"""One server's life through its faults (serve/): an API key asked of every /v1/ request (401 without it),
chat completions in each model's own template, a full queue answered with 429 at once, then SIGTERM with
requests in flight: the one that fits in the grace period ends with its text, the one that does not with an
error that says why, and no new connection is taken. Each completion's text is the in-process decode's. Two
SmolLM2 copies with their chat template: the bundled model that has one."""

import dataclasses
import os
import threading
import time

import httpx
import openai
import pytest

from adafuse import ChatPrompt, Ensemble, Request, model_config
from tests.support.bad_inputs import bad_input, pattern
from tests.support.paths import ROOT
from tools.serve_process import serving

pytestmark = pytest.mark.slow

GRACE = 15.0  # seconds the requests in flight get after SIGTERM: the short one needs a few
BATCH, QUEUE = 2, 1  # so the fourth concurrent completion finds the server full
NAME = "smollm2_135m+smollm2_135m"
QUESTIONS = ["What is the capital of France?", "Name a large planet.", "What do bees make?"]
LONG = "Repeat the word hello 500 times."  # answered at length: hello, hello, ...
NEVER_CONFIDENT = {"tau": 1.5}  # every word branches and is scored: a slow completion
KEY = "sk-test-8f3a"  # the server's, from $ADAFUSE_API_KEY


@pytest.fixture(scope="module")
def reference():
    """The same models in this process: what every completion must equal."""
    chat = dataclasses.replace(model_config("smollm2_135m"), chat_template=True)
    return Ensemble.from_config([chat, chat])


def decoded(reference, prompt: str, max_tokens: int) -> str:
    return reference.decode(Request(prompt, max_new_tokens=max_tokens)).text


def test_faults_leave_the_server_answering_and_the_other_texts_unchanged(reference, tmp_path):
    threads = os.environ["OMP_NUM_THREADS"]
    args = ["--models", NAME, "--chat-template", "--threads", threads, "--batch-size", str(BATCH)]
    args += ["--queue-limit", str(QUEUE), "--grace", str(GRACE)]
    with serving(*args, log=tmp_path / "server.log", env={"ADAFUSE_API_KEY": KEY}) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=600)

        # The key: every /v1/ route asks for it before reading a body; the probes' routes do not.
        body = {"model": NAME, "prompt": QUESTIONS[0], "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": KEY}):
            refused = httpx.post(f"{server.url}/v1/completions", json=body, headers=headers, timeout=60)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", refused.text
            case = bad_input("serve_no_key")
            assert str(refused.status_code) == case.error
            assert pattern(case.message, ROOT).fullmatch(refused.json()["error"]["message"]), refused.text
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0).models.list()
        assert client.models.list().data[0].id == NAME
        assert httpx.get(f"{server.url}/health", timeout=60).status_code == 200
        assert server.metrics()['adafuse_requests_total{route="/v1/completions",status="401"}'] == 3
        assert "without an API key" not in server.log_text()

        # Chat: one user message, which each model reads in its own chat template, as the engine renders a prompt;
        # a system message before it, as most clients send one, in the template's system turn.
        message = [{"role": "user", "content": QUESTIONS[0]}]
        chat = client.chat.completions.create(model=NAME, messages=message, max_tokens=8)
        assert chat.choices[0].message.content == decoded(reference, QUESTIONS[0], 8)
        system = [{"role": "system", "content": "Answer in one word."}, *message]
        briefly = client.chat.completions.create(model=NAME, messages=system, max_tokens=8)
        expected = decoded(reference, ChatPrompt(QUESTIONS[0], "Answer in one word."), 8)
        assert briefly.choices[0].message.content == expected != chat.choices[0].message.content
        stream = client.chat.completions.create(model=NAME, messages=message, max_tokens=8, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == chat.choices[0].message.content

        # A full queue: BATCH decoding and QUEUE waiting; one more is refused at once, the others go on.
        texts: dict[int, str] = {}

        def ask(i: int) -> None:
            reply = client.completions.create(model=NAME, prompt=QUESTIONS[i], max_tokens=24)
            texts[i] = reply.choices[0].text

        askers = [threading.Thread(target=ask, args=(i,)) for i in range(len(QUESTIONS))]
        for asker in askers:
            asker.start()
        wait_for(server, lambda m: m["adafuse_in_flight"] + m["adafuse_queue_length"] == BATCH + QUEUE)
        refused_at = time.monotonic()
        with pytest.raises(openai.RateLimitError, match="the server is full"):
            client.completions.create(model=NAME, prompt=QUESTIONS[0], max_tokens=24)
        assert time.monotonic() - refused_at < 5
        for asker in askers:
            asker.join()
        assert texts == {i: decoded(reference, q, 24) for i, q in enumerate(QUESTIONS)}

        # SIGTERM with two completions in flight: a short one ends with its text, a long one with an error.
        short: dict = {}
        long_stream = client.completions.create(
            model=NAME, prompt=LONG, max_tokens=512, stream=True, extra_body={"adafuse": NEVER_CONFIDENT}
        )
        first = next(iter(long_stream))
        assert first.choices[0].text
        asker = threading.Thread(
            target=lambda: short.update(text=client.completions.create(model=NAME, prompt=QUESTIONS[1], max_tokens=6))
        )
        asker.start()
        wait_for(server, lambda m: m["adafuse_in_flight"] == 2)
        server.process.terminate()
        time.sleep(1)
        with pytest.raises(httpx.ConnectError):  # the server takes no new connection while it drains
            httpx.get(f"{server.url}/health", timeout=5)
        with pytest.raises(openai.APIError, match="grace period"):
            for _ in long_stream:
                pass
        asker.join()
        assert short["text"].choices[0].text == decoded(reference, QUESTIONS[1], 6)
        server.process.wait(GRACE + 30)
        assert "Finished server process" in server.log_text()


def wait_for(server, condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition(server.metrics()):
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.1)
