"""The proxy's HTTP layer (aiohttp): routes, bearer token, request limits, OpenAI JSON errors, SSE.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models (OpenAI's), POST /feedback
and POST /commit (Trinity's), GET /stats (the proxy's counters) and GET /health (no token needed).
Every error is OpenAI's JSON body with the matching status: 400 a malformed or unsupported request,
401 a missing or wrong token, 404 an unknown route, session or id, 405 a wrong method, 409 a
conflict, 410 an expired session, 413 a body over explorer.serve.max_request_bytes, 429 over
max_concurrent_requests, 500 a fault here. A refused request changes nothing. Streamed completions:
streaming.py.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from services.common.logging import get_logger
from services.common.security import tokens_match
from services.explorer.serve.commits import Commits
from services.explorer.serve.core import ServeCore
from services.explorer.serve.protocol import (
    IDEMPOTENCY_HEADER,
    SESSION_HEADER,
    ApiError,
    Limits,
    completion_body,
    parse_request,
)
from services.explorer.serve.streaming import stream_completion

log = get_logger("explorer.serve.app")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_ROUTES = ("/health",)


def _error(exc: ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


def make_app(
    core: ServeCore,
    commits: Commits,
    limits: Limits,
    *,
    model_name: str,
    token: str | None,
    max_request_bytes: int,
    version: Callable[[], int],
) -> web.Application:
    """The aiohttp application; `version()` is the version the proxy serves (the oldest engine's)."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return _error(exc)
        except web.HTTPRequestEntityTooLarge:
            return _error(
                ApiError(
                    413, f"the request body is over explorer.serve.max_request_bytes ({max_request_bytes})"
                )
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(ApiError(exc.status, f"{exc.reason}: {request.method} {request.path}"))
        except Exception as exc:  # noqa: BLE001 - answered as OpenAI's server error, logged here
            log.exception("serve_request_failed", path=request.path)
            return _error(ApiError(500, f"{type(exc).__name__}: {exc}"))

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token is not None and request.path not in OPEN_ROUTES:
            given = request.headers.get("Authorization", "")
            if not (given.startswith("Bearer ") and tokens_match(given[len("Bearer ") :], token)):
                raise ApiError(401, "missing or wrong bearer token (services.auth)", code="invalid_api_key")
        return await handler(request)

    async def body_of(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc

    async def completions(request: web.Request, chat: bool) -> web.StreamResponse:
        body = await body_of(request)
        parsed = parse_request(
            body,
            limits,
            chat=chat,
            session_header=request.headers.get(SESSION_HEADER),
            idempotency_header=request.headers.get(IDEMPOTENCY_HEADER),
        )
        core.admit(parsed.idempotency_key)
        try:
            if parsed.stream:
                return await stream_completion(core, parsed, request)
            done = await core.complete(parsed)
        finally:
            core.release(parsed.idempotency_key)
        headers = {
            "X-Model-Version": str(done.version),
            SESSION_HEADER: parsed.session_id or done.response_id,
        }
        payload = completion_body(done.response_id, parsed, done.version, done.choices, done.usage)
        return web.json_response(payload, headers=headers)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await completions(request, True)

    async def text(request: web.Request) -> web.StreamResponse:
        return await completions(request, False)

    async def models(_request: web.Request) -> web.Response:
        entry = {"id": model_name, "object": "model", "owned_by": "trinity-grpc", "model_version": version()}
        return web.json_response({"object": "list", "data": [entry]})

    async def feedback(request: web.Request) -> web.Response:
        reply = await commits.feedback(await body_of(request))
        return web.json_response({**reply, "model_version": version()})

    async def commit(request: web.Request) -> web.Response:
        reply = await commits.commit(await body_of(request))
        return web.json_response({**reply, "model_version": version()})

    async def stats(_request: web.Request) -> web.Response:
        got = await commits.stats()
        return web.json_response({**got, "model_version": version(), "in_flight": core.in_flight})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model_version": version()})

    app = web.Application(middlewares=[errors, auth], client_max_size=max_request_bytes)
    app.add_routes(
        [
            web.post("/v1/chat/completions", chat),
            web.post("/v1/completions", text),
            web.get("/v1/models", models),
            web.post("/feedback", feedback),
            web.post("/commit", commit),
            web.get("/stats", stats),
            web.get("/health", health),
        ]
    )
    return app
