"""`adafuse-serve`: the ensemble as an OpenAI-compatible HTTP server (docs/serve.md).

    adafuse-serve --pair tiny --method adafuse tau=0.7 --batch-size 8 --port 8000

FastAPI routes on uvicorn's event loop; one engine thread (serve/loop.py) runs the engine loop, and requests
join the batch in flight between its steps. Because merged passes are exact, a completion's text is the
one `Ensemble.decode` (and run.py) gives for the same request, however many others are decoding beside it.

Routes: POST /v1/completions and /v1/chat/completions (serve/protocol.py checks their bodies), GET
/v1/models, /health and /metrics (Prometheus text). With `--api-key` (or $ADAFUSE_API_KEY) every /v1/ route
asks for `Authorization: Bearer <key>` (401 without). A body larger than `--max-body-mb` is refused (413)
before it is read whole. SIGTERM drains: no new requests, those in flight finish, and any still decoding after
`--grace` seconds ends with an error that says why.
"""

import argparse
import asyncio
import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import time
import uuid
from collections import Counter
from contextlib import asynccontextmanager

import torch
import uvicorn
import yaml
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from adafuse import DEFAULT_BATCH_SIZE, Ensemble
from adafuse.errors import AdaFuseError
from adafuse.methods import METHODS
from eval.runner import model_configs
from serve.loop import EngineLoop, Ticket
from serve.protocol import (
    ApiError,
    Completion,
    Defaults,
    finish_reason,
    method_config,
    parse_body,
    parse_chat,
    parse_completion,
    usage,
    word_logprobs,
    words,
)

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
DEFAULT_QUEUE_LIMIT = 64  # completions waiting for a slot; one more is refused with 429
DEFAULT_MAX_TOKENS_LIMIT = 512
DEFAULT_GRACE_SECONDS = 30.0
# A request body's bound: ample for any prompt a model here can read (a 128k-token context at a few bytes a token,
# escaped in JSON), small enough that reading and parsing one costs the server a fraction of a second.
DEFAULT_MAX_BODY_MB = 32.0
API_KEY_VARIABLE = "ADAFUSE_API_KEY"
# uvicorn's own limit on the shutdown, after ours: time for the error responses to be written
SHUTDOWN_MARGIN_SECONDS = 5.0


class Server:
    """The routes' shared state: the engine's thread, the defaults, and the request counts for /metrics."""

    def __init__(self, engine_loop: EngineLoop, defaults: Defaults, max_body_bytes: int):
        self.engine_loop = engine_loop
        self.defaults = defaults
        self.max_body_bytes = max_body_bytes
        self.requests: Counter = Counter()  # (route, status) -> count
        self.started = int(time.time())

    async def complete(self, http: HttpRequest, chat: bool) -> Response:
        route = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            body = parse_body(await self._body(http))
            completion = (parse_chat if chat else parse_completion)(body, self.defaults)
            ticket = self.engine_loop.open(completion)
        except ApiError as err:
            return self._error(route, err)
        try:
            await self.engine_loop.check(ticket)  # on the prompt-check thread: the engine's goes on meanwhile
        except ApiError as err:
            self.engine_loop.close_ticket(ticket, finished=True)  # it never reached the engine
            return self._error(route, err)
        self.engine_loop.admit(ticket)
        streaming = finished = False
        try:
            kind, detail = await ticket.events.get()
            if kind != "admitted":
                return self._error(route, detail)
            reply = Reply(self, ticket, chat, prompt_tokens=detail)
            if completion.stream:
                streaming = True  # the response closes the ticket when it ends
                self.requests[route, 200] += 1
                return ReplyStream(reply)
            answer = await reply.whole(http)
            if answer is None:  # the client left: its examples are dropped (below)
                self.requests[route, 499] += 1
                return Response(status_code=499)
            finished = True
            self.requests[route, 200] += 1
            return JSONResponse(answer)
        except ApiError as err:
            return self._error(route, err)
        finally:
            if not streaming:
                self.engine_loop.close_ticket(ticket, finished)

    async def _body(self, http: HttpRequest) -> bytes:
        """The request's body; ApiError 413 as soon as it is known to exceed the bound (its Content-Length, or the
        bytes read so far), without reading the rest."""
        too_large = ApiError(
            413,
            f"the body is larger than this server's bound of {self.max_body_bytes} bytes (--max-body-mb); a prompt "
            "longer than the models' contexts could not be read anyway",
        )
        declared = http.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    def _error(self, route: str, err: ApiError) -> JSONResponse:
        self.requests[route, err.status] += 1
        return JSONResponse(err.body(), status_code=err.status)

    def models(self) -> dict:
        d = self.defaults
        knobs = dataclasses.asdict(d.config)
        return {
            "object": "list",
            "data": [
                {
                    "id": d.model,
                    "object": "model",
                    "created": self.started,
                    "owned_by": "adafuse",
                    "adafuse": {"models": list(d.models), "method": d.method, "knobs": knobs},
                }
            ],
        }

    def metrics(self) -> str:
        """Prometheus' text format: requests by route and status, the queue, passes and rows per model,
        seconds per example."""
        c = self.engine_loop.counters
        lines = [
            "# HELP adafuse_requests_total HTTP requests answered, by route and status.",
            "# TYPE adafuse_requests_total counter",
        ]
        lines += [
            f'adafuse_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())
        ]
        gauges = {
            "adafuse_queue_length": ("Completions waiting for a slot.", c.queued),
            "adafuse_in_flight": ("Completions decoding.", c.in_flight),
        }
        for name, (text, value) in gauges.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value}"]
        per_model = {
            "adafuse_passes_total": ("Forward passes run, by model.", "passes"),
            "adafuse_merged_passes_total": (
                "Passes that carried several completions' rows, by model.",
                "merged_passes",
            ),
            "adafuse_rows_total": ("Rows over those passes, by model (rows per pass: this over passes).", "rows"),
            "adafuse_pass_seconds_total": ("Wall seconds of the passes, by model.", "seconds"),
        }
        for name, (text, key) in per_model.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
            lines += [f'{name}{{model="{model}"}} {counts[key]}' for model, counts in c.passes.items()]
        lines += [
            "# HELP adafuse_example_seconds Seconds from a completion's arrival to its end.",
            "# TYPE adafuse_example_seconds summary",
            f"adafuse_example_seconds_sum {c.example_seconds}",
            f"adafuse_example_seconds_count {c.examples}",
            "# HELP adafuse_failed_total Completions whose decoding failed.",
            "# TYPE adafuse_failed_total counter",
            f"adafuse_failed_total {c.failed}",
            "# HELP adafuse_cancelled_total Completions dropped before their end (their client left).",
            "# TYPE adafuse_cancelled_total counter",
            f"adafuse_cancelled_total {c.cancelled}",
        ]
        return "\n".join(lines) + "\n"


class Reply:
    """One admitted request's answer, whole or streamed, built from its ticket's events."""

    def __init__(self, server: Server, ticket: Ticket, chat: bool, prompt_tokens: list):
        self.server, self.ticket, self.chat = server, ticket, chat
        self.completion: Completion = ticket.completion
        self.prompt_tokens = prompt_tokens
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.finished = False  # every choice streamed to its end
        self.closed = False

    def close(self) -> None:
        """Give the ticket back (once): its examples are dropped if the stream did not see them end."""
        if not self.closed:
            self.closed = True
            self.server.engine_loop.close_ticket(self.ticket, self.finished)

    def _envelope(self, choices: list, streamed: bool) -> dict:
        kind = ("chat.completion.chunk" if streamed else "chat.completion") if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.server.defaults.model,
            "choices": choices,
        }

    def _usage(self, generations: list) -> dict:
        d = self.server.defaults
        return usage(d.models, self.completion.used, self.prompt_tokens, generations)

    async def whole(self, http: HttpRequest) -> dict | None:
        """The response body once every choice is done; None if the client disconnects first."""
        generations: list = [None] * len(self.completion.requests)
        gone = asyncio.create_task(_disconnected(http))
        try:
            while any(g is None for g in generations):
                event = await _next_event(self.ticket, gone)
                if event is None:
                    return None
                if event[0] == "failed":
                    raise event[1]
                _, choice, generation = event
                generations[choice] = generation
            scores = await self._scores(generations, gone) if self.completion.logprobs else None
            if self.completion.logprobs and scores is None:
                return None
        finally:
            gone.cancel()
        choices = []
        for i, (request, generation) in enumerate(zip(self.completion.requests, generations)):
            text = request.prompt + generation.text if self.completion.echo else generation.text
            reason = finish_reason(generation.stats.stop_reason)
            if self.chat:
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": reason,
                        "logprobs": None,
                    }
                )
            else:
                choices.append(
                    {
                        "index": i,
                        "text": text,
                        "logprobs": None if scores is None else scores[i],
                        "finish_reason": reason,
                    }
                )
        return self._envelope(choices, streamed=False) | {"usage": self._usage(generations)}

    async def _scores(self, generations: list, gone: asyncio.Task) -> list | None:
        """Per choice, OpenAI's `logprobs` object over the returned text's words (docs/serve.md: what they mean)."""
        layouts, pairs = [], []
        for request, generation in zip(self.completion.requests, generations):
            if self.completion.echo:
                layout = word_logprobs("", request.prompt + generation.text)
            else:
                layout = word_logprobs(request.prompt, generation.text)
            layouts.append(layout)
            pairs += layout[2]
        self.server.engine_loop.score(self.ticket, pairs)
        event = await _next_event(self.ticket, gone)
        if event is None:
            return None
        if event[0] == "failed":
            raise event[1]
        values = iter(event[1])
        return [
            {
                "tokens": pieces,
                "token_logprobs": [next(values).logprob for _ in pieces],
                "top_logprobs": None,  # the ensemble has no distribution over one vocabulary to rank
                "text_offset": offsets,
            }
            for pieces, offsets, _ in layouts
        ]

    async def stream(self):
        """Server-sent events: one chunk per word as it becomes final, a last chunk per choice with its
        finish_reason, the usage if asked, then [DONE]. An error ends the stream with an error event."""
        completion, ticket = self.completion, self.ticket
        sent = [""] * len(completion.requests)
        generations: list = [None] * len(completion.requests)
        for i, request in enumerate(completion.requests):
            if self.chat:
                yield _event(
                    self._envelope(
                        [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], True
                    )
                )
            elif completion.echo:
                yield _event(self._envelope([self._piece(i, request.prompt, None)], True))
        while any(g is None for g in generations):
            event = await ticket.events.get()
            if event[0] == "failed":
                yield _event(event[1].body())
                return
            _, choice, value = event
            text = value if event[0] == "text" else value.text
            for word in words(text[len(sent[choice]) :]):
                yield _event(self._envelope([self._piece(choice, word, None)], True))
            sent[choice] = text
            if event[0] == "done":
                generations[choice] = value
                reason = finish_reason(value.stats.stop_reason)
                yield _event(self._envelope([self._piece(choice, "", reason)], True))
        self.finished = True
        if completion.include_usage:
            yield _event(self._envelope([], True) | {"usage": self._usage(generations)})
        yield "data: [DONE]\n\n"

    def _piece(self, choice: int, text: str, reason: str | None) -> dict:
        if self.chat:
            return {"index": choice, "delta": {"content": text} if text else {}, "finish_reason": reason}
        return {"index": choice, "text": text, "logprobs": None, "finish_reason": reason}


class ReplyStream(StreamingResponse):
    """A reply's events as server-sent events. However the response ends (done, the client gone, even before
    the first event), the ticket is given back."""

    def __init__(self, reply: Reply):
        super().__init__(reply.stream(), media_type="text/event-stream")
        self.reply = reply

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.reply.close()


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def _disconnected(http: HttpRequest) -> None:
    """Returns when the client disconnects (its body already read, the next ASGI message is the disconnect)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _next_event(ticket: Ticket, gone: asyncio.Task):
    """The ticket's next event, or None if the client disconnected first."""
    getting = asyncio.ensure_future(ticket.events.get())
    await asyncio.wait({getting, gone}, return_when=asyncio.FIRST_COMPLETED)
    if getting.done():
        return getting.result()
    getting.cancel()
    return None


class RequireKey:
    """ASGI middleware: every /v1/ route answers 401 unless the request carries `Authorization: Bearer <key>`, as
    vLLM's --api-key does (/health and /metrics stay open to the cluster's probes). It answers before the route
    reads the body."""

    def __init__(self, app, key: str, server: Server):
        self.app, self.key, self.server = app, key.encode(), server

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and not self._authorized(scope):
            refused = ApiError(401, "this server needs an API key: send the header 'Authorization: Bearer <key>'")
            self.server.requests[scope["path"], 401] += 1
            response = JSONResponse(refused.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)


def create_app(
    engine_loop: EngineLoop,
    defaults: Defaults,
    api_key: str | None = None,
    max_body_bytes: int = int(DEFAULT_MAX_BODY_MB * 2**20),
) -> FastAPI:
    server = Server(engine_loop, defaults, max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine_loop.start()
        yield
        engine_loop.stop()

    app = FastAPI(title="adafuse-serve", lifespan=lifespan)
    app.state.server = server
    if api_key:
        app.add_middleware(RequireKey, key=api_key, server=server)

    @app.post("/v1/completions")
    async def completions(http: HttpRequest) -> Response:
        return await server.complete(http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HttpRequest) -> Response:
        return await server.complete(http, chat=True)

    @app.get("/v1/models")
    async def models() -> dict:
        return server.models()

    @app.get("/health")
    async def health() -> Response:
        if engine_loop.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(server.metrics(), media_type="text/plain; version=0.0.4")

    return app


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which on SIGTERM (or ^C) also starts the engine's drain: uvicorn stops accepting and
    waits for the responses in flight; the engine fails what is still decoding once the grace period ends."""

    def __init__(self, config: uvicorn.Config, engine_loop: EngineLoop, grace: float):
        super().__init__(config)
        self.engine_loop, self.grace = engine_loop, grace

    def handle_exit(self, sig, frame) -> None:
        self.engine_loop.drain(self.grace)
        super().handle_exit(sig, frame)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adafuse-serve",
        description="The ensemble as an OpenAI-compatible server (docs/serve.md).",
    )
    parser.add_argument("knobs", nargs="*", metavar="KNOB=VALUE", help="the method's settings, e.g. tau=0.5")
    parser.add_argument("--pair", help="a model pair of conf/model_pair (default: tiny)")
    parser.add_argument("--models", help="instead of --pair: conf/model names joined by '+'")
    parser.add_argument("--method", default="adafuse", help="the default method (a request may name another)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="completions decoding at once")
    parser.add_argument("--queue-limit", type=int, default=DEFAULT_QUEUE_LIMIT, help="completions waiting beyond them")
    parser.add_argument(
        "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS_LIMIT, help="the most max_tokens a request may ask for"
    )
    parser.add_argument("--host", default="127.0.0.1", help="where to listen (default: the loopback only)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_VARIABLE) or None,
        help=f"the key /v1/ routes ask for as 'Authorization: Bearer <key>' (default: ${API_KEY_VARIABLE}; none)",
    )
    parser.add_argument(
        "--max-body-mb", type=float, default=DEFAULT_MAX_BODY_MB, help="a larger request body is refused (413)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port (the log says which)")
    parser.add_argument("--served-name", help="the model id clients send (default: the pair's name, or --models)")
    parser.add_argument(
        "--chat-template", action="store_true", help="every model renders prompts in its own chat template"
    )
    parser.add_argument(
        "--grace", type=float, default=DEFAULT_GRACE_SECONDS, help="seconds in-flight requests get on SIGTERM"
    )
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--cache-dir", help="where converted models are kept (default: $ADAFUSE_CACHE)")
    return parser


def loopback(host: str) -> bool:
    """Does `host` listen on the loopback only (127.0.0.0/8, ::1, localhost), unreachable from other machines?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it resolves to whatever the machine says
        return False


def _knobs(parser: argparse.ArgumentParser, tokens: list[str]) -> dict:
    knobs = {}
    for token in tokens:
        name, sep, value = token.partition("=")
        if not sep or not name:
            parser.error(f"a method setting is KNOB=VALUE, got {token!r}")
        knobs[name] = yaml.safe_load(value)  # 0.5, 3, true, null, [0.5, 0.5] as YAML reads them
    return knobs


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("batch_size", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.queue_limit < 0 or args.grace < 0 or args.port < 0:
        parser.error("--queue-limit, --grace and --port must be >= 0")
    if not args.max_body_mb > 0:
        parser.error(f"--max-body-mb must be > 0, got {args.max_body_mb}")
    if not args.api_key and not loopback(args.host):
        log.warning(
            "listening on %s without an API key: anyone who can reach this address can use the ensemble; on a machine "
            "shared with others set --api-key (or $%s)",
            args.host,
            API_KEY_VARIABLE,
        )
    try:
        configs = model_configs(args.pair, args.models)
        if args.chat_template:
            configs = [dataclasses.replace(c, chat_template=True) for c in configs]
        names = tuple(c.name for c in configs)
        spec = METHODS[args.method]
        provisional = Defaults("", args.method, spec.config(), args.max_tokens, names, (False,) * len(names))
        _, cfg, _ = method_config({"method": args.method, **_knobs(parser, args.knobs)}, provisional, server=True)
    except (AdaFuseError, ApiError) as err:
        parser.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        ensemble = Ensemble.from_config(configs, args.cache_dir)
    except AdaFuseError as err:
        parser.exit(2, f"adafuse-serve: {err}\n")
    defaults = Defaults(
        model=args.served_name or args.models or args.pair or "tiny",
        method=args.method,
        config=cfg,
        max_tokens=args.max_tokens,
        models=names,
        chat=tuple(c.chat_template for c in configs),
    )
    engine_loop = EngineLoop(ensemble, batch_size=args.batch_size, queue_limit=args.queue_limit)
    config = uvicorn.Config(
        create_app(engine_loop, defaults, args.api_key, int(args.max_body_mb * 2**20)),
        host=args.host,
        port=args.port,
        timeout_graceful_shutdown=args.grace + SHUTDOWN_MARGIN_SECONDS,
        log_level="info",
    )
    DrainingServer(config, engine_loop, args.grace).run()


if __name__ == "__main__":
    main()
