"""OpenAI-compatible HTTP API over a ModelWrapper, on loopback, for agent code inside workflows.

Serves GET /v1/models, POST /v1/chat/completions and POST /v1/completions (no streaming). Each
call goes through the wrapper, so it is batched with every other rollout and recorded in the
wrapper's history when enable_history is on. Standard library only: it runs in a daemon thread
and the calls it serves block in their own handler threads, like a sync workflow does.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from services.common.errors import TrinityError
from services.explorer.chat_parsers import parse_hermes_tool_calls, split_deepseek_r1_reasoning

_PASSED_KEYS = ("n", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "min_tokens")


def _sampling_args(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in _PASSED_KEYS if body.get(k) is not None}


def _choice_logprobs(exp: Any, tokenizer: Any) -> dict[str, Any]:
    response = exp.tokens[exp.prompt_length :].tolist()
    return {
        "content": [
            {"token": tokenizer.decode([tok]), "logprob": float(lp), "bytes": None, "top_logprobs": []}
            for tok, lp in zip(response, exp.logprobs.tolist(), strict=True)
        ]
    }


def _completion_logprobs(exp: Any, tokenizer: Any, *, as_ids: bool) -> dict[str, Any]:
    """The legacy completions `logprobs` object of a response (the sampled token only at each place)."""
    response = exp.tokens[exp.prompt_length :].tolist()
    pieces = [tokenizer.decode([tok]) for tok in response]
    tokens = [f"token_id:{tok}" for tok in response] if as_ids else pieces
    logprobs = [float(lp) for lp in exp.logprobs.tolist()]
    offsets = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=0)) if pieces else []
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, logprobs, strict=True)],
        "text_offset": offsets,
    }


def _usage(exps: list[Any]) -> dict[str, int]:
    prompt = exps[0].prompt_length if exps else 0
    completion = sum(e.response_length for e in exps)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def reply_message(text: str, wrapper: Any, *, tools_offered: bool) -> dict[str, Any]:
    """The assistant message of a reply: reasoning split off and tool calls parsed when configured
    (explorer.rollout_model.reasoning_parser / tool_call_parser, see chat_parsers.py)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if getattr(wrapper, "reasoning_parser", None) == "deepseek_r1":
        message["reasoning_content"], message["content"] = split_deepseek_r1_reasoning(text)
    if tools_offered and getattr(wrapper, "tool_call_parser", None) == "hermes":
        content, calls = parse_hermes_tool_calls(message["content"])
        if calls:
            message["content"], message["tool_calls"] = content or None, calls
    return message


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them, as vLLM prepares them.

    Content given as a list of parts (AgentScope always sends one) becomes its text parts joined by
    newlines; a part that is not text (an image) is refused, the engines being text-only. A tool
    call's `arguments` JSON string becomes the object it encodes, so templates that serialise the
    arguments (Qwen's) do not encode them twice.
    """
    out = []
    for i, message in enumerate(messages):
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise TrinityError(
                        f"messages[{i}].content: only text parts are supported (the engines are "
                        f"text-only), got a part of type {kind!r}"
                    )
                texts.append(str(part.get("text", "")))
            message["content"] = "\n".join(texts)
        if message.get("tool_calls"):
            message["tool_calls"] = [_decoded_call(call) for call in message["tool_calls"]]
        out.append(message)
    return out


def _decoded_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except json.JSONDecodeError:
            pass  # left as the model wrote it
    return {**call, "function": function}


class OpenAIServer:
    """One HTTP server bound to 127.0.0.1, serving one ModelWrapper: on `port` (0: a free one), asking
    for `Authorization: Bearer <api_key>` unless api_key is EMPTY (explorer.rollout_model.api_key)."""

    def __init__(
        self, wrapper: Any, host: str = "127.0.0.1", *, port: int = 0, api_key: str = "EMPTY"
    ) -> None:
        self.wrapper = wrapper
        self.api_key = api_key
        handler = type("Handler", (_Handler,), {"server_ref": self})
        try:
            self._httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise TrinityError(
                f"the OpenAI API cannot listen on {host}:{port} ({exc.strerror}); pick another "
                "explorer.rollout_model.base_port (or auxiliary model's), or leave it unset for free ports",
                field="explorer.rollout_model.base_port",
            ) from exc
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="openai-api", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = cast("tuple[str, int]", self._httpd.server_address)[:2]  # an AF_INET server
        return f"http://{host}:{port}/v1"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            raise TrinityError("stream=true is not supported by the explorer's OpenAI API")
        messages = template_messages(body["messages"])
        exps = self.wrapper.chat(
            messages,
            tools=body.get("tools"),
            template_kwargs=body.get(
                "chat_template_kwargs"
            ),  # vLLM's per-request extra, e.g. enable_thinking
            **_sampling_args(body),
        )
        choices = []
        for i, exp in enumerate(exps):
            message = reply_message(exp.response_text, self.wrapper, tools_offered=bool(body.get("tools")))
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "finish_reason": "tool_calls"
                if message.get("tool_calls")
                else exp.info.get("finish_reason", "stop"),
            }
            if body.get("logprobs"):
                choice["logprobs"] = _choice_logprobs(exp, self.wrapper.tokenizer)
            choices.append(choice)
        return self._envelope("chat.completion", body, choices, exps)

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Text prompts, or token-id prompts (a list of ids, or a list of such lists) sampled as given,
        as vLLM takes them; `logprobs` (any count) returns the sampled tokens' logprobs in the legacy
        completions layout, each token as "token_id:<id>" with vLLM's `return_tokens_as_token_ids`."""
        prompt, args = body["prompt"], _sampling_args(body)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            exps = [e for ids in prompt for e in self.wrapper.generate_tokens(ids, **args)]
        else:
            exps = self.wrapper.generate(prompt if isinstance(prompt, list) else [prompt], **args)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        wanted = body.get("logprobs")  # a count (0: the sampled token only); false / absent: none
        choices = [
            {
                "index": i,
                "text": exp.response_text,
                "finish_reason": exp.info.get("finish_reason", "stop"),
                "logprobs": None
                if wanted is None or wanted is False
                else _completion_logprobs(exp, self.wrapper.tokenizer, as_ids=as_ids),
            }
            for i, exp in enumerate(exps)
        ]
        return self._envelope("text_completion", body, choices, exps)

    def _envelope(
        self, kind: str, body: dict[str, Any], choices: list[dict[str, Any]], exps: list[Any]
    ) -> dict[str, Any]:
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model") or self.wrapper.model_name,
            "choices": choices,
            "usage": _usage(exps),
        }


class _Handler(BaseHTTPRequestHandler):
    server_ref: OpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence per-request lines
        return None

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        """True when no key is asked for or the request carries it; otherwise answers 401."""
        key = self.server_ref.api_key
        if key in ("", "EMPTY") or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, {"error": {"message": "missing or wrong API key", "type": "invalid_api_key"}})
        return False

    def do_GET(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        if self.path.rstrip("/").endswith("/models"):
            name = self.server_ref.wrapper.model_name
            self._send(
                200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "trinity-grpc"}]}
            )
        else:
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if not self._authorized():
            self.rfile.read(length)
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path.rstrip("/").endswith("/chat/completions"):
                self._send(200, self.server_ref.chat_completion(body))
            elif self.path.rstrip("/").endswith("/completions"):
                self._send(200, self.server_ref.completion(body))
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        except (KeyError, ValueError, TrinityError) as exc:
            self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
        except Exception as exc:  # noqa: BLE001 - reported to the agent as a server error
            self._send(500, {"error": {"message": repr(exc), "type": "server_error"}})
