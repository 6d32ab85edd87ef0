"""The OpenAI API's request bodies, checked field by field into our requests, and its response bodies.

Everything a body asks for is checked here, before anything reaches the engine: a bad field is an `ApiError`
(a 4xx whose JSON names the field), never a failure halfway through a decode. Every method here decodes
greedily, so whatever asks for sampling (`temperature` > 0, `top_p` < 1, `n` > 1, penalties, `logit_bias`)
is refused with the reason. What needs the models' tokenizers (does the prompt fit each model's context?)
is checked by serve/loop.py, on a thread of its own with its own copies of them.
"""

import dataclasses
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from adafuse import ChatPrompt, Request, resolve_method, through_last_blank_line
from adafuse.errors import ConfigError, UnknownNameError
from adafuse.methods import METHODS

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_LOGPROBS = 5  # OpenAI's bound on `logprobs`
# Knobs that name files on the server (DeePEn's matrix folder, LLM-Blender's ranker weights): set when the
# server starts, never by a request.
SERVER_ONLY_KNOBS = ("cache_dir", "pairrm_path")
# Fields a client may send that change nothing here: greedy decoding gives the same text for any seed.
IGNORED = ("seed", "user")
SAMPLING_REFUSED = "every method here decodes greedily (AdaFuse's word choice is deterministic)"


class ApiError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error body, naming the field (`param`)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        kind = {429: "rate_limit_error", 404: "not_found_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


def parse_body(raw: bytes) -> Any:
    """A request body as JSON; whatever it is if not (bytes that are not UTF-8, malformed JSON, arrays nested too deep
    for the parser, a number too long to convert), an ApiError 400 that says which."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ApiError(400, "the body is not JSON this server reads: it is nested too deep") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer of more digits than Python converts
        raise ApiError(400, f"the body is not valid JSON: {err}") from None


@dataclass(frozen=True)
class Defaults:
    """What a request may leave out, and the server's bounds."""

    model: str  # the name the server answers to (/v1/models)
    method: str  # the default method, and its config with the server's knobs
    config: object
    max_tokens: int  # the most a request may ask for
    models: tuple[str, ...]  # the ensemble's model names
    chat: tuple[bool, ...]  # per model: does it render prompts in its own chat template?


@dataclass(frozen=True)
class Completion:
    """One checked request of either endpoint: its prompts (one choice each) and how to decode and answer."""

    requests: tuple[Request, ...]
    method: Any  # adafuse.methods.Method
    config: object
    used: tuple[int, ...]  # the models the method decodes with (indices into Defaults.models)
    reserve: int  # positions the method may use after a prompt
    echo: bool
    logprobs: bool  # each word's log-probability (`word_logprobs`)
    stream: bool
    include_usage: bool  # a last streamed chunk with the usage


COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "stop", "echo", "logprobs", "stream", "stream_options"}
CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options"}
SAMPLING_FIELDS = {"n", "best_of", "temperature", "top_p", "presence_penalty", "frequency_penalty", "logit_bias"}
EXTENSION = "adafuse"  # the field of our own: {"method": ..., knob: value, ...}


def parse_completion(body: Any, defaults: Defaults) -> Completion:
    """A /v1/completions body, checked."""
    _check_fields(body, COMPLETION_FIELDS | {"suffix"})
    if body.get("suffix") is not None:
        raise ApiError(400, "suffix (insertion) is not supported: the methods here only continue a prompt", "suffix")
    prompts = _prompts(body.get("prompt"))
    logprobs = _integer(body, "logprobs", None, 0, MAX_LOGPROBS)
    stream = _boolean(body, "stream", False)
    if logprobs is not None and stream:
        raise ApiError(
            400, "logprobs with stream is not supported: each word is scored once its text is whole", "logprobs"
        )
    max_tokens = _integer(body, "max_tokens", DEFAULT_MAX_TOKENS, 1, defaults.max_tokens)
    return _completion(body, defaults, prompts, max_tokens, _boolean(body, "echo", False), logprobs is not None)


def parse_chat(body: Any, defaults: Defaults) -> Completion:
    """A /v1/chat/completions body, checked: one user message after any system messages, read by every model in its
    own chat template."""
    _check_fields(body, CHAT_FIELDS | {"logprobs", "top_logprobs"})
    if body.get("logprobs") or body.get("top_logprobs") is not None:
        raise ApiError(400, "logprobs are not served for chat (see /v1/completions with echo)", "logprobs")
    prompt = _conversation(body.get("messages"))
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, field, defaults.max_tokens, 1, defaults.max_tokens)
    chat = _completion(body, defaults, [prompt], max_tokens, echo=False, logprobs=False)
    plain = [defaults.models[k] for k in chat.used if not defaults.chat[k]]
    if plain:
        raise ApiError(
            400,
            f"chat completions need every model the method decodes with to read the conversation in its own chat "
            f"template, and {', '.join(plain)} reads plain text: start the server with --chat-template (models "
            "that have a template), or send the text to /v1/completions",
            "messages",
        )
    return chat


def _completion(body, defaults: Defaults, prompts, max_tokens: int, echo: bool, logprobs: bool) -> Completion:
    model = body.get("model")
    if model is not None and model != defaults.model:
        raise ApiError(404, f"model {model!r} is not served here; this server serves {defaults.model!r}", "model")
    _refuse_sampling(body)
    stop = _stop(body.get("stop"))
    spec, cfg, used = method_config(body.get(EXTENSION), defaults)
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise ApiError(400, "stream_options is {'include_usage': bool}, with stream: true", "stream_options")
    requests = tuple(
        # What the prompt shares with others through its last blank line (a few-shot prompt's exemplars) is read
        # once and kept, as the runner and the lm_eval model read their prompts: the same split, so the same bits.
        Request(p, stop=stop, max_new_tokens=max_tokens, prefix=through_last_blank_line(p))
        for p in prompts
    )
    return Completion(
        requests=requests,
        method=spec,
        config=cfg,
        used=tuple(used),
        reserve=spec.positions_needed(cfg, max_tokens),
        echo=echo,
        logprobs=logprobs,
        stream=stream,
        include_usage=bool(options and _boolean(options, "include_usage", False)),
    )


def method_config(extension: Any, defaults: Defaults, server: bool = False) -> tuple[Any, object, list[int]]:
    """(Method, its config, the models it uses) for a request's `adafuse` field: `method` (default: the server's)
    and knobs, over the server's knobs for its own method and the method's defaults for another. `server`: the
    server's own settings, which may name files."""
    if extension is None:
        extension = {}
    if not isinstance(extension, dict):
        raise ApiError(400, f"{EXTENSION} is an object such as {{'method': 'unite', 'top_k': 10}}", EXTENSION)
    knobs = dict(extension)
    name = knobs.pop("method", defaults.method)
    if not isinstance(name, str) or name not in METHODS:
        raise ApiError(400, str(UnknownNameError("method", name, list(METHODS))), f"{EXTENSION}.method")
    spec = METHODS[name]
    valid = {f.name: f for f in dataclasses.fields(spec.config)}
    for knob, value in knobs.items():
        if knob not in valid:
            raise ApiError(
                400,
                f"method {name!r} has no setting {knob!r}; its settings: {', '.join(sorted(valid)) or '(none)'}",
                f"{EXTENSION}.{knob}",
            )
        if knob in SERVER_ONLY_KNOBS and not server:
            raise ApiError(
                400, f"{knob} names a file on the server: set it when starting the server", f"{EXTENSION}.{knob}"
            )
        if not _fits(value, valid[knob].type):
            raise ApiError(
                400, f"{name}.{knob} must be {_spelled(valid[knob].type)}, got {value!r}", f"{EXTENSION}.{knob}"
            )
    try:
        spec, cfg = resolve_method(defaults.config if name == defaults.method else name, knobs)
        used = spec.members_used(cfg, len(defaults.models))
    except ConfigError as err:
        raise ApiError(400, str(err), EXTENSION) from None
    return spec, cfg, used


def _check_fields(body: Any, known: set[str]) -> None:
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - known - SAMPLING_FIELDS - set(IGNORED) - {EXTENSION})
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(unknown)}", unknown[0])


def _refuse_sampling(body: dict) -> None:
    """Greedy decoding only: each field that asks for sampling or for several answers, refused with why."""
    for name, greedy in (("n", 1), ("best_of", 1)):
        if body.get(name) not in (None, greedy):
            raise ApiError(400, f"{name} must be 1: {SAMPLING_REFUSED}, so every answer would be the same", name)
    temperature = body.get("temperature")
    if temperature is not None and (not _is_number(temperature) or temperature != 0):
        raise ApiError(400, f"temperature must be 0 (or left out): {SAMPLING_REFUSED}", "temperature")
    top_p = body.get("top_p")
    if top_p is not None and (not _is_number(top_p) or top_p != 1):
        raise ApiError(400, f"top_p must be 1 (or left out): {SAMPLING_REFUSED}", "top_p")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0):
            raise ApiError(400, f"{name} must be 0 (or left out): {SAMPLING_REFUSED}, with no penalties", name)
    if body.get("logit_bias"):
        raise ApiError(400, "logit_bias is not supported: the ensemble's models share no vocabulary", "logit_bias")


def _prompts(prompt: Any) -> list[str]:
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts:
        raise ApiError(400, "prompt must be a string or a non-empty list of strings", "prompt")
    if any(isinstance(p, int) or isinstance(p, list) for p in prompts):
        raise ApiError(
            400,
            "prompt: token ids are not accepted, as the ensemble's models tokenize differently; send text "
            "(lm_eval's local-completions: tokenizer_backend=None)",
            "prompt",
        )
    for p in prompts:
        if not isinstance(p, str):
            raise ApiError(400, f"prompt must be text, got {type(p).__name__}", "prompt")
        if not p:
            raise ApiError(400, "prompt is empty: there is nothing to continue", "prompt")
        _unicode(p, "prompt")
    return prompts


def _unicode(text: str, field: str) -> None:
    """JSON's \\u escapes can spell half a surrogate pair, which is no character: refused, as no model can read it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ApiError(400, f"{field} is not Unicode text: {err.reason} at character {err.start}", field) from None


SYSTEM_ROLES = ("system", "developer")  # OpenAI's clients send their instructions under either name


def _conversation(messages: Any) -> ChatPrompt:
    """A conversation's user message and the system messages before it (joined by a blank line), as most clients
    send a chat: each model renders them in its own chat template. Content is a string or a list of text parts."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ApiError(400, "messages must be a non-empty list of {role, content}", "messages")
    *before, last = messages
    if last.get("role") != "user" or any(m.get("role") not in SYSTEM_ROLES for m in before):
        raise ApiError(
            400,
            "messages must be one user message, after any system messages: each model renders them in its own "
            "chat template (spec §1); a conversation of several turns is not decoded here",
            "messages",
        )
    system = "\n\n".join(_text(m, i) for i, m in enumerate(before))
    return ChatPrompt(_text(last, len(before)), system)


def _text(message: dict, index: int) -> str:
    content = message.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str) or not content:
        raise ApiError(400, f"messages[{index}].content must be non-empty text", "messages")
    _unicode(content, "messages")
    return content


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "stop must be a string or a list of strings", "stop")
    if any(not s for s in stops):
        raise ApiError(400, "stop: an empty stop string would stop before the first word", "stop")
    for text in stops:
        _unicode(text, "stop")
    return tuple(stops)


def _integer(body: dict, name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {value!r}", name)
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}, got {value}", name)
    return value


def _boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {value!r}", name)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fits(value: Any, annotation) -> bool:
    """Is a JSON value of a knob's annotated type (float, int, bool, str, list[...], X | None, Any)?"""
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return any(_fits(value, option) for option in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if annotation is float:
        return _is_number(value)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _spelled(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation)


# ---- responses ------------------------------------------------------------------------------------------------

WORD = re.compile(r"\s*\S+|\s+")  # a word with the whitespace before it, or whitespace that ends the text


def words(text: str) -> list[str]:
    """`text` as words, each with the whitespace before it: they join back to `text`."""
    return WORD.findall(text)


def finish_reason(stop_reason: str) -> str:
    """OpenAI's finish_reason for a Stats.stop_reason: a stop string or end-of-sequence is "stop"."""
    return "length" if stop_reason == "length" else "stop"


def usage(names: tuple[str, ...], used: tuple[int, ...], prompt_tokens: list, generations: list) -> dict:
    """OpenAI's usage, summed over the models the method decoded with, and each model's own counts (`models`):
    every model reads the prompt and writes the output in its own tokens, so no one count is the ensemble's."""
    models = [
        {
            "name": names[k],
            "prompt_tokens": sum(lengths[k] for lengths in prompt_tokens),
            "completion_tokens": sum(gen.stats.tokens_generated[i] for gen in generations),
        }
        for i, k in enumerate(used)
    ]
    prompt = sum(m["prompt_tokens"] for m in models)
    completion = sum(m["completion_tokens"] for m in models)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "models": models,
    }


def word_logprobs(context: str, text: str) -> tuple[list[str], list[int], list[tuple[str, str]]]:
    """The words of `text` (the returned text: the prompt, if echoed, then the completion), their offsets in it,
    and what to score for each: (everything before the word, the word), `context` being what precedes `text`."""
    pieces = words(text)
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return pieces, offsets, [(context + text[:offset], piece) for piece, offset in zip(pieces, offsets)]
