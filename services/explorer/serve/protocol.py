"""The OpenAI wire format of the proxy: request validation and response building, no I/O.

Requests are checked whole before anything happens (no generation, no record): an unsupported or
malformed parameter is an `ApiError` with OpenAI's error body and the HTTP status it maps to.
Parameters the engines cannot honour (stop sequences, penalties, top logprobs, forced tool choice,
JSON mode) are refused by name rather than ignored; unknown parameters are refused as OpenAI does.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    410: "gone_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}
SESSION_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
SESSION_HEADER = "X-Session-Id"
IDEMPOTENCY_HEADER = "Idempotency-Key"
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")

# accepted and without effect on what is generated or recorded
_INERT = {"user", "metadata", "store", "parallel_tool_calls", "service_tier", "stream_options", "model"}
_REFUSED = {
    "stop": "stop sequences are not supported by the engines here",
    "presence_penalty": "penalties are not supported by the engines here",
    "frequency_penalty": "penalties are not supported by the engines here",
    "repetition_penalty": "penalties are not supported by the engines here",
    "logit_bias": "logit_bias is not supported by the engines here",
    "seed": "per-request seeds are not supported by the engines here",
    "response_format": "JSON mode / structured outputs are not supported by the engines here",
    "functions": "the legacy `functions` parameter is not supported; use `tools`",
    "function_call": "the legacy `function_call` parameter is not supported; use `tools`",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "echo": "echo is not supported",
    "suffix": "suffix is not supported",
    "best_of": "best_of is not supported; use n",
}
_SAMPLING = ("n", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "min_tokens")
_CHAT = {"messages", "tools", "tool_choice", "logprobs", "top_logprobs", "stream", "session_id"}
_CHAT |= {"chat_template_kwargs", *_SAMPLING}
_TEXT = {"prompt", "logprobs", "stream", "session_id", *_SAMPLING}
_ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, the parameter at fault and a code."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass
class Limits:
    """What a request may ask for (model.max_response_tokens, explorer.serve.max_n)."""

    max_tokens: int
    max_n: int
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclass
class CompletionRequest:
    """A validated /v1/chat/completions (chat) or /v1/completions (text) request."""

    chat: bool
    model: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt: str = ""
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    session_id: str | None = None
    idempotency_key: str | None = None
    """The Idempotency-Key header: a retry with the same key gets the response recorded for it."""

    @property
    def sampling(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "min_tokens": min(self.min_tokens, self.max_tokens),
        }


def _number(body: dict[str, Any], key: str, low: float, high: float, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(400, f"{key} must be a number, got {value!r}", param=key)
    if not low <= value <= high:
        raise ApiError(400, f"{key} must be in [{low:g}, {high:g}], got {value}", param=key)
    return float(value)


def _integer(body: dict[str, Any], key: str, low: int, high: int, default: int, why: str = "") -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be an integer, got {value!r}", param=key)
    if not low <= value <= high:
        raise ApiError(400, f"{key} must be in [{low}, {high}]{why}, got {value}", param=key)
    return value


def session_of(body: dict[str, Any], header: str | None) -> str | None:
    """The session id: the X-Session-Id header or the body's `session_id` (one, or both equal)."""
    given = body.get("session_id")
    if given is not None and not isinstance(given, str):
        raise ApiError(400, f"session_id must be a string, got {given!r}", param="session_id")
    if header is not None and given is not None and header != given:
        raise ApiError(400, f"the {SESSION_HEADER} header and session_id differ", param="session_id")
    sid = given if given is not None else header
    if sid is not None and not SESSION_ID.match(sid):
        raise ApiError(
            400, "session_id must be 1-128 characters of letters, digits and . _ : @ -", param="session_id"
        )
    return sid


def idempotency_key_of(header: str | None) -> str | None:
    if header is not None and not _IDEMPOTENCY_KEY.match(header):
        raise ApiError(
            400, f"the {IDEMPOTENCY_HEADER} header must be 1-255 printable ASCII characters without spaces"
        )
    return header


def _check_keys(body: dict[str, Any], allowed: set[str]) -> None:
    for key in body:
        if key in _REFUSED:
            if body[key] is None or (key == "stop" and body[key] == []):
                continue
            raise ApiError(400, f"{key}: {_REFUSED[key]}", param=key, code="unsupported_parameter")
        if key not in allowed and key not in _INERT:
            raise ApiError(400, f"Unrecognized request argument supplied: {key}", param=key)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ApiError(
                400, f"messages[{i}] must be an object with a role in {list(_ROLES)}", param=f"messages[{i}]"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ApiError(
                400, f"messages[{i}].content must be a string or a list of parts", param="messages"
            )
    return messages


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise ApiError(400, "tools must be a list of tool objects", param="tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise ApiError(
            400,
            "tool_choice: only auto and none are supported (the engines cannot force a call)",
            param="tool_choice",
            code="unsupported_parameter",
        )
    return None if choice == "none" else (tools or None)


def parse_request(
    body: Any,
    limits: Limits,
    *,
    chat: bool,
    session_header: str | None,
    idempotency_header: str | None = None,
) -> CompletionRequest:
    """Validate a completion request body; raises ApiError (400) naming the parameter."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_keys(body, _CHAT if chat else _TEXT)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required (any name: the proxy serves one model)", param="model")
    request = CompletionRequest(chat=chat, model=model, session_id=session_of(body, session_header))
    request.idempotency_key = idempotency_key_of(idempotency_header)
    if chat:
        request.messages = _messages(body)
        request.tools = _tools(body)
        kwargs = body.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ApiError(400, "chat_template_kwargs must be an object", param="chat_template_kwargs")
        request.template_kwargs = kwargs
        request.logprobs = bool(body.get("logprobs") or False)
        if _integer(body, "top_logprobs", 0, 20, 0):
            raise ApiError(
                400,
                "top_logprobs > 0: only the sampled tokens' logprobs are recorded here",
                param="top_logprobs",
                code="unsupported_parameter",
            )
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ApiError(400, "prompt must be a non-empty string (one prompt per request)", param="prompt")
        request.prompt = prompt
        request.logprobs = _integer(body, "logprobs", 0, 0, -1, " (only the sampled tokens' logprobs)") == 0
    _sampling(body, limits, request)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    request.stream, request.include_usage = (
        stream,
        bool(isinstance(options, dict) and options.get("include_usage")),
    )
    return request


def _sampling(body: dict[str, Any], limits: Limits, request: CompletionRequest) -> None:
    request.n = _integer(body, "n", 1, limits.max_n, 1, " (explorer.serve.max_n)")
    request.temperature = _number(body, "temperature", 0.0, 2.0, limits.temperature)
    request.top_p = _number(body, "top_p", 1e-9, 1.0, limits.top_p)
    request.top_k = max(_integer(body, "top_k", -1, 1 << 20, limits.top_k), 0)
    why = " (model.max_response_tokens)"
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    request.max_tokens = _integer(body, key, 1, limits.max_tokens, limits.max_tokens, why)
    request.min_tokens = _integer(body, "min_tokens", 0, limits.max_tokens, limits.min_tokens, why)


# --- responses ---------------------------------------------------------------------------------


@dataclass
class Choice:
    """One generated choice as the response shows it."""

    text: str
    """The response decoded without special tokens."""
    message: dict[str, Any] | None
    """Chat: the assistant message (reasoning split off and tool calls parsed when configured)."""
    finish_reason: str
    tokens: list[str]
    """Each sampled token's own text (what `logprobs` shows)."""
    logprobs: list[float]
    pieces: list[str]
    """The text in per-token increments that add up to `text` (what a stream sends)."""


def token_logprobs(tokens: list[str], logprobs: list[float], chat: bool) -> dict[str, Any]:
    """OpenAI's `logprobs` of sampled tokens (their texts and logprobs; no top logprobs)."""
    if chat:
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(tokens, logprobs, strict=True)
            ]
        }
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": None}


def _logprobs(choice: Choice, chat: bool) -> dict[str, Any]:
    return token_logprobs(choice.tokens, choice.logprobs, chat)


def envelope(rid: str, request: CompletionRequest, version: int, usage: dict[str, int]) -> dict[str, Any]:
    """Fields every response and chunk shares: its id, the model and the version that generated it."""
    return {
        "id": rid,
        "object": "chat.completion" if request.chat else "text_completion",
        "created": int(time.time()),
        "model": request.model,
        "system_fingerprint": f"trinity-grpc-v{version}",
        "model_version": version,
        "session_id": request.session_id,
        "usage": usage,
    }


def completion_body(
    rid: str, request: CompletionRequest, version: int, choices: list[Choice], usage: dict[str, int]
) -> dict[str, Any]:
    body = envelope(rid, request, version, usage)
    out = []
    for i, choice in enumerate(choices):
        item: dict[str, Any] = {"index": i, "finish_reason": choice.finish_reason}
        if request.chat:
            item["message"] = choice.message
        else:
            item["text"] = choice.text
        item["logprobs"] = _logprobs(choice, request.chat) if request.logprobs else None
        out.append(item)
    body["choices"] = out
    return body


def chunk_base(rid: str, request: CompletionRequest, version: int) -> dict[str, Any]:
    """The fields every stream chunk shares (the envelope, without usage)."""
    base = envelope(rid, request, version, {})
    base.pop("usage")
    if request.chat:
        base["object"] = "chat.completion.chunk"
    return base


def make_chunk(
    base: dict[str, Any],
    request: CompletionRequest,
    index: int,
    delta: dict[str, Any],
    finish: str | None = None,
    lp: Any = None,
) -> dict[str, Any]:
    """One stream chunk of choice `index`: a chat `delta`, or a text completion's `text` (delta's content)."""
    item: dict[str, Any] = {"index": index}
    if request.chat:
        item["delta"] = delta
    else:
        item["text"] = delta.get("content", "")
    item["finish_reason"], item["logprobs"] = finish, lp
    return {**base, "choices": [item]}


def stream_chunks(
    rid: str, request: CompletionRequest, version: int, choices: list[Choice], usage: dict[str, int]
) -> list[dict[str, Any]]:
    """The SSE chunks of a finished completion: per choice a role chunk (chat), the text token by
    token (in one piece when the message differs from the raw text: reasoning split off, tool calls
    parsed), tool calls in one chunk, a finish chunk; then a usage chunk if stream_options asks."""
    base = chunk_base(rid, request, version)

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> dict[str, Any]:
        return make_chunk(base, request, index, delta, finish, lp)

    chunks = []
    for i, choice in enumerate(choices):
        message = choice.message or {}
        if request.chat:
            chunks.append(chunk(i, {"role": "assistant", "content": ""}))
        content = message.get("content") if request.chat else choice.text
        plain = content == choice.text and len(choice.pieces) == len(choice.tokens)
        if plain:
            for j, piece in enumerate(choice.pieces):
                single = Choice(piece, None, "", [choice.tokens[j]], [choice.logprobs[j]], [piece])
                lp = _logprobs(single, request.chat) if request.logprobs else None
                chunks.append(chunk(i, {"content": piece}, lp=lp))
        else:
            if message.get("reasoning_content"):
                chunks.append(chunk(i, {"reasoning_content": message["reasoning_content"]}))
            if content:
                lp = _logprobs(choice, request.chat) if request.logprobs else None
                chunks.append(chunk(i, {"content": content}, lp=lp))
            if message.get("tool_calls"):
                calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                chunks.append(chunk(i, {"tool_calls": calls}))
        chunks.append(chunk(i, {}, finish=choice.finish_reason))
    if request.include_usage:
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks
