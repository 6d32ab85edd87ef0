"""The server (serve/, `adafuse-serve`) as a subprocess on 127.0.0.1 with the bundled pair, called by the official
`openai` client: under load every completion's text is run.py's prediction bit for bit (the committed grid's),
streamed or not; bad requests are refused naming the field; a client killed mid-stream frees its slot and
changes no other text; lm_eval's `local-completions` model answers as `adafuse-lm-eval`. (The committed texts
were decoded on another CPU: what that asks of the host, tests/integration/test_grid_identity.py says.)"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

import eval.lm_harness  # noqa: F401  (registers lm_eval's model "adafuse")
from eval.lm_tasks import write_tasks
from serve.protocol import words
from tests.support.bad_inputs import bad_input, pattern
from tests.support.paths import ROOT, SHARED_DATA
from tools.serve_process import serving

pytestmark = pytest.mark.slow

RUN = ROOT / "results" / "grid" / "nq" / "adafuse" / "tiny" / "default"  # run.py's NQ run: AdaFuse, tiny pair
PROMPTS = 16
CLIENTS = 32  # each sends one completion, all at once: half of them streamed
BUDGET, STOP = 32, ["\n"]  # the run's task settings (conf/task/nq.yaml)
MAX_TOKENS = 64  # the server's limit
LONG = "Count: 1, 2, 3,"  # a prompt the pair continues for as long as it may


def committed() -> list[dict]:
    lines = (RUN / "predictions.jsonl").read_text().splitlines()[:PROMPTS]
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    threads = os.environ["OMP_NUM_THREADS"]  # conftest's share of the cores, the test process's own
    args = ["--pair", "tiny", "--threads", threads, "--max-tokens", str(MAX_TOKENS), "--queue-limit", str(CLIENTS)]
    with serving(*args, log=log) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)


def complete(client, prompt: str, stream: bool) -> tuple[str, str, list[str]]:
    """(text, finish_reason, the streamed chunks) of one completion."""
    if not stream:
        reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=BUDGET, stop=STOP)
        return reply.choices[0].text, reply.choices[0].finish_reason, []
    chunks, reason = [], None
    for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=BUDGET, stop=STOP, stream=True):
        chunks.append(chunk.choices[0].text)
        reason = chunk.choices[0].finish_reason or reason
    return "".join(chunks), reason, chunks


def test_concurrent_completions_are_run_py_s_predictions_bit_for_bit(server, client):
    records = committed()
    results: dict[int, tuple] = {}
    start = threading.Barrier(CLIENTS)

    def one(i: int) -> None:
        start.wait()
        results[i] = complete(client, records[i % PROMPTS]["prompt"], stream=i >= PROMPTS)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(CLIENTS))
    for i, (text, reason, chunks) in results.items():
        record = records[i % PROMPTS]
        assert text == record["prediction"], (i, record["id"])
        assert reason == ("length" if record["stats"]["stop_reason"] == "length" else "stop"), record["id"]
        if i >= PROMPTS:  # the text came word by word as each became final, then a last chunk with the reason
            assert all(len(words(chunk)) == 1 for chunk in chunks[:-1]) and chunks[-1] == "", chunks
    metrics = server.metrics()
    assert metrics['adafuse_merged_passes_total{model="gemma3_270m"}'] > 0  # the completions did share passes


BAD_REQUESTS = [
    # (route, body, status, the field the error names, a phrase of its message)
    ("completions", b"{not json", 400, None, "not valid JSON"),
    ("completions", b'{"prompt": "Hi", "max_tokens": ' + b"9" * 5000 + b"}", 400, None, "not valid JSON"),
    ("completions", [1, 2], 400, None, "JSON object"),
    ("completions", {"prompt": "Hi", "adafuse": {"method": "unit"}}, 400, "adafuse.method", "Did you mean 'unite'"),
    ("completions", {"prompt": "Hi", "adafuse": {"taus": 0.5}}, 400, "adafuse.taus", "no setting 'taus'"),
    ("completions", {"prompt": "Hi", "adafuse": {"tau": -0.5}}, 400, "adafuse", "tau must be >= 0"),
    ("completions", {"prompt": "Hi", "adafuse": {"tau": "high"}}, 400, "adafuse.tau", "must be float"),
    ("completions", {"prompt": "Hi", "adafuse": {"method": "deepen", "cache_dir": "/"}}, 400, "adafuse.cache_dir", ""),
    ("completions", {"prompt": ""}, 400, "prompt", "empty"),
    ("completions", {"prompt": [[1, 2, 3]]}, 400, "prompt", "token ids"),
    ("completions", {"prompt": "word " * 9000}, 400, "prompt", "a prompt has 9001 tokens"),  # counted, then refused
    ("completions", {"prompt": "word " * 200_000}, 400, "prompt", "a prompt of 1000000 bytes has more than"),
    ("completions", {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens", "between 1 and 64"),
    ("completions", {"prompt": "Hi", "max_tokens": MAX_TOKENS + 1}, 400, "max_tokens", "between 1 and 64"),
    ("completions", {"prompt": "Hi", "n": 2}, 400, "n", "greedily"),
    ("completions", {"prompt": "Hi", "temperature": 0.8}, 400, "temperature", "greedily"),
    ("completions", {"prompt": "Hi", "top_p": 0.9}, 400, "top_p", "greedily"),
    ("completions", {"prompt": "Hi", "stop": [""]}, 400, "stop", "empty stop string"),
    ("completions", {"prompt": "Hi", "logprobs": 1, "stream": True}, 400, "logprobs", "stream"),
    ("completions", {"prompt": "Hi", "best_of": 3}, 400, "best_of", "greedily"),
    ("completions", {"prompt": "Hi", "frobnicate": 1}, 400, "frobnicate", "unknown field"),
    ("completions", {"prompt": "Hi", "model": "gpt-4"}, 404, "model", "serves 'tiny'"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, 400, "messages", "gemma3_270m"),
]


# The server's cases of tools/bad_inputs.py (docs/configuration.md's table) and the body each sends.
BAD_INPUTS = {
    "serve_nested_json": (b"[" * 100_000 + b"]" * 100_000, None),  # was a 500: the parser's recursion overflowed
    "serve_surrogate": (b'{"prompt": "Hi \\ud800"}', "prompt"),
}


def assert_refused_as_written(key: str, reply: httpx.Response, field: str | None) -> None:
    case, error = bad_input(key), reply.json()["error"]
    assert (reply.status_code, error["param"]) == (int(case.error), field), error
    assert pattern(case.message, ROOT).fullmatch(error["message"]), error["message"]


def test_bad_requests_are_refused_naming_the_field(server, client):
    for key, (body, field) in BAD_INPUTS.items():
        assert_refused_as_written(key, httpx.post(f"{server.url}/v1/completions", content=body, timeout=60), field)
    for route, body, status, field, phrase in BAD_REQUESTS:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        reply = httpx.post(f"{server.url}/v1/{route}", content=content, timeout=60)
        error = reply.json()["error"]
        assert (reply.status_code, error["param"]) == (status, field), (body, error)
        assert phrase in error["message"], (body, error)
    with pytest.raises(openai.BadRequestError, match="greedily"):  # as the official client shows it
        client.completions.create(model="tiny", prompt="Hi", temperature=1.0)
    assert client.completions.create(model="tiny", prompt="The capital of Italy is", max_tokens=2).choices[0].text


def test_a_body_over_the_bound_is_refused_before_it_is_read_whole(server, client):
    body = b'{"prompt": "' + b"word " * 8_000_000 + b'"}'  # 40 MB, over the default 32 MiB
    reply = httpx.post(f"{server.url}/v1/completions", content=body, timeout=120)
    assert_refused_as_written("serve_body_too_large", reply, None)
    assert client.completions.create(model="tiny", prompt="The capital of Italy is", max_tokens=2).choices[0].text


def test_a_30_mb_prompt_is_refused_by_its_size_and_a_completion_beside_it_is_not_delayed(server, client):
    """The prompt is refused from its bytes alone, before any tokenizer reads it, off the engine's thread (it
    used to be tokenized whole on the engine's thread: 38 s, during which every completion waited). A small
    completion takes as long beside it as alone, give or take the reading of 30 MB: each is timed alone and
    beside one, in turn, and the fastest of each compared (the machine's other work only ever adds time)."""
    big = json.dumps({"model": "tiny", "prompt": "word " * 6_000_000}).encode()  # 30 MB

    def small() -> float:
        started = time.perf_counter()
        client.completions.create(model="tiny", prompt="The capital of Italy is", max_tokens=4)
        return time.perf_counter() - started

    def beside_big() -> tuple[float, float]:
        seconds: list[float] = []
        asker = threading.Thread(target=lambda: seconds.append(small()))
        asker.start()
        time.sleep(0.1)  # the small completion is in flight
        started = time.perf_counter()
        reply = httpx.post(f"{server.url}/v1/completions", content=big, timeout=300)
        refused_after = time.perf_counter() - started
        asker.join()
        assert_refused_as_written("serve_prompt_bytes", reply, "prompt")
        return seconds[0], refused_after

    alone, beside, refused = [], [], []
    for _ in range(5):  # enough turns that some of each fall in a quiet moment of a shared machine
        alone.append(small())
        seconds, refused_after = beside_big()
        beside.append(seconds)
        refused.append(refused_after)
    print(f"a small completion: {min(alone):.2f} s alone, {min(beside):.2f} s beside a 30 MB prompt (refused in "
          f"{max(refused):.2f} s at most)")  # fmt: skip
    assert min(beside) - min(alone) < 1.0, (alone, beside, refused)
    assert max(refused) < 5, refused


KILLED_CLIENT = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
for chunk in client.completions.create(model="tiny", prompt=sys.argv[2], max_tokens=int(sys.argv[3]), stream=True):
    print(repr(chunk.choices[0].text), flush=True)
"""


def test_a_client_killed_mid_stream_frees_its_slot_and_changes_no_other_text(server, client):
    before = server.metrics()["adafuse_cancelled_total"]
    streamer = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLIENT, f"{server.url}/v1", LONG, str(MAX_TOKENS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    record = committed()[1]
    other: dict = {}
    beside = threading.Thread(target=lambda: other.update(text=complete(client, record["prompt"], stream=False)[0]))
    assert streamer.stdout.readline()  # its first word arrived: it is decoding
    beside.start()
    streamer.send_signal(signal.SIGKILL)
    streamer.wait()
    deadline = time.monotonic() + 120
    while server.metrics()["adafuse_cancelled_total"] == before:
        assert time.monotonic() < deadline, "the killed client's completion was never cancelled"
        time.sleep(0.2)
    beside.join()
    assert other["text"] == record["prediction"]
    assert server.metrics()["adafuse_in_flight"] == 0
    assert client.completions.create(model="tiny", prompt="The capital of Italy is", max_tokens=2).choices[0].text


def test_lm_eval_s_local_completions_answers_as_adafuse_lm_eval(server, tmp_path):
    write_tasks(tmp_path, str(SHARED_DATA), tasks=["nq"], limit=4)
    manager = TaskManager(include_path=str(tmp_path))

    def answers(model: str, model_args: str) -> list[str]:
        results = simple_evaluate(
            model=model, model_args=model_args, tasks=["adafuse_nq"], task_manager=manager, limit=4, log_samples=True
        )
        by_document = {s["doc_id"]: s["resps"][0][0] for s in results["samples"]["adafuse_nq"]}
        return [by_document[i] for i in sorted(by_document)]

    # An ensemble has no one tokenizer: lm_eval sends text (tokenizer_backend=None), four requests at a time.
    remote = answers(
        "local-completions",
        f"base_url={server.url}/v1/completions,model=tiny,tokenizer_backend=None,num_concurrent=4",
    )
    assert len(remote) == 4 and remote == answers("adafuse", "pair=tiny,method=adafuse,batch_size=4")


def test_echo_logprobs_are_the_ensemble_s_loglikelihood_of_each_word(server, client, tiny):
    prompt = "The capital of France is"
    reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, echo=True, logprobs=0)
    (choice,) = reply.choices
    assert choice.text.startswith(prompt)
    tokens, offsets = choice.logprobs.tokens, choice.logprobs.text_offset
    assert "".join(tokens) == choice.text and all(choice.text[o:].startswith(t) for t, o in zip(tokens, offsets))
    expected = tiny.loglikelihood([(choice.text[:o], t) for t, o in zip(tokens, offsets)])
    assert choice.logprobs.token_logprobs == pytest.approx([e.logprob for e in expected], abs=1e-5)
    per_model = reply.usage.model_extra["models"]
    assert [m["name"] for m in per_model] == ["smollm2_135m", "gemma3_270m"]
    assert reply.usage.prompt_tokens == sum(m["prompt_tokens"] for m in per_model) == 5 + 6  # Gemma adds <bos>
    (model,) = client.models.list().data
    assert model.id == "tiny" and httpx.get(f"{server.url}/health").json() == {"status": "ok"}
