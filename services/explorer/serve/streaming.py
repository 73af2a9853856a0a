"""Streamed completions (`stream: true`): SSE chunks sent while the engine generates.

A request is checked whole first (core.prepare: any refusal is an ordinary JSON error); then the
headers go out with the version the engine generates with, and each token's text is sent as the
engine samples it (TokenStream). The text of a token that ends inside a multi-byte character, or
whose prefix decodes differently once more tokens come, is held back until it decodes stably, so
the chunks add up exactly to the recorded response text. With `logprobs`, each chunk carries the
logprobs of the tokens whose text it sends, in order. The engine's weights are held only until it
has finished (not until a slow client has read everything). The turn is recorded in the history
from the engine's own ids and logprobs, never from the streamed text; the finish chunk (and the
usage chunk, `[DONE]`) go out only after that, so a client that saw them can send feedback for its
response id. A chat reply whose message may differ from its text (reasoning split off, tool calls
parsed) is sent once complete (protocol.stream_chunks), as is the reply of an engine that does
not stream (each token then in its own chunk at the end).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from services.common.logging import get_logger
from services.explorer.engines.base import SamplingParams
from services.explorer.engines.stream import TokenStream
from services.explorer.serve.core import Completion, ServeCore
from services.explorer.serve.gate import pick
from services.explorer.serve.protocol import (
    SESSION_HEADER,
    ApiError,
    CompletionRequest,
    chunk_base,
    make_chunk,
    stream_chunks,
    token_logprobs,
)

log = get_logger("explorer.serve.streaming")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class IncrementalText:
    """The text of a growing list of token ids, handed out in stable increments (special tokens skipped)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""
        self._held: list[int] = []  # indices (into ids) of the tokens whose text is not sent yet

    def push(self, token_id: int) -> tuple[str, list[int]]:
        """Add a token; returns the text to send now and the indices of the tokens it completes
        (("", []) while the text is held back)."""
        self.ids.append(token_id)
        self._held.append(len(self.ids) - 1)
        text = str(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        if not text.startswith(self.sent) or text.endswith("\ufffd") or text == self.sent:
            return "", []
        return self._take(text)

    def finish(self, final: str) -> tuple[str, list[int]]:
        """The rest of the recorded text `final` (which the sent text must begin) and the tokens held."""
        if not final.startswith(self.sent):
            raise ValueError(f"the streamed text {self.sent!r} does not begin the recorded text {final!r}")
        return self._take(final)

    def _take(self, text: str) -> tuple[str, list[int]]:
        delta, self.sent = text[len(self.sent) :], text
        rows, self._held = self._held, []
        return delta, rows


async def _send(response: web.StreamResponse, payload: Any) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    await response.write(f"data: {data}\n\n".encode())


class ChoiceStreams:
    """The chunks of every choice of one streamed completion."""

    def __init__(self, core: ServeCore, request: CompletionRequest, rid: str, version: int) -> None:
        self.core, self.request = core, request
        self.base = chunk_base(rid, request, version)
        self.texts = [IncrementalText(core.tokenizer) for _ in range(request.n)]
        self.logprobs: list[list[float]] = [[] for _ in range(request.n)]

    def _lp(self, index: int, rows: list[int]) -> Any:
        """The logprobs of choice `index`'s tokens `rows` (None unless the request asks)."""
        if not self.request.logprobs:
            return None
        ids = self.texts[index].ids
        tokens = [str(self.core.tokenizer.decode([ids[r]], skip_special_tokens=False)) for r in rows]
        return token_logprobs(tokens, [self.logprobs[index][r] for r in rows], self.request.chat)

    def opening(self) -> list[dict[str, Any]]:
        if not self.request.chat:
            return []
        return [
            make_chunk(self.base, self.request, i, {"role": "assistant", "content": ""})
            for i in range(self.request.n)
        ]

    def token(self, index: int, token_id: int, logprob: float) -> dict[str, Any] | None:
        """The chunk this token completes (None while its text is held back)."""
        self.logprobs[index].append(logprob)
        delta, rows = self.texts[index].push(token_id)
        if not rows:
            return None
        return make_chunk(self.base, self.request, index, {"content": delta}, lp=self._lp(index, rows))

    def closing(self, done: Completion, engine_ids: list[list[int]]) -> list[dict[str, Any]]:
        """Per choice: the tokens not streamed, the rest of its text, its finish; then usage if asked."""
        chunks = []
        for i, choice in enumerate(done.choices):
            text, ids = self.texts[i], engine_ids[i]
            if ids[: len(text.ids)] != text.ids:
                raise ValueError(f"choice {i}: the streamed token ids differ from the engine's outputs")
            for token_id, logprob in zip(ids[len(text.ids) :], choice.logprobs[len(text.ids) :], strict=True):
                chunk = self.token(i, token_id, logprob)
                chunks += [chunk] if chunk is not None else []
            rest, rows = text.finish(choice.text)
            if rows:
                chunks.append(make_chunk(self.base, self.request, i, {"content": rest}, lp=self._lp(i, rows)))
            chunks.append(make_chunk(self.base, self.request, i, {}, finish=choice.finish_reason))
        if self.request.include_usage:
            chunks.append({**self.base, "choices": [], "usage": done.usage})
        return chunks


async def stream_completion(
    core: ServeCore, request: CompletionRequest, http: web.Request
) -> web.StreamResponse:
    """Answer a `stream: true` request (see the module docstring)."""
    prepared = await core.prepare(request)
    session = {SESSION_HEADER: request.session_id or prepared.response_id}
    response = web.StreamResponse(headers={**session, **SSE_HEADERS})
    if prepared.replay or core.reshapes(request):  # answered again, or sent once complete
        done = await core.complete(request, prepared)
        response.headers["X-Model-Version"] = str(done.version)
        await response.prepare(http)
        for chunk in stream_chunks(done.response_id, request, done.version, done.choices, done.usage):
            await _send(response, chunk)
        return await _end(response)
    gate = pick(core.gates)
    async with gate.serving() as version:
        response.headers["X-Model-Version"] = str(version)
        await response.prepare(http)
        streams = ChoiceStreams(core, request, prepared.response_id, version)
        stream = TokenStream(gate.engine, [prepared.ids.tolist()], SamplingParams(**request.sampling))
        writer = asyncio.create_task(_pump(stream, streams, response))
        try:
            outputs = (await stream.outputs())[0]
        except Exception as exc:  # noqa: BLE001 - the status is sent: the error goes in the stream
            writer.cancel()
            log.exception("serve_stream_failed", response_id=prepared.response_id)
            return await _fail(response, exc)
    try:
        # recorded whether or not the client is still there: the engine sampled it
        done = await core.record(prepared, request, version, outputs)
        await writer
        for chunk in streams.closing(done, [o.response_ids.tolist() for o in outputs]):
            await _send(response, chunk)
    except ConnectionError:  # the turn is recorded; nobody to tell
        log.info("serve_stream_client_gone", response_id=prepared.response_id)
        return response
    except Exception as exc:  # noqa: BLE001 - the status is sent: the error goes in the stream
        log.exception("serve_stream_failed", response_id=prepared.response_id)
        return await _fail(response, exc)
    return await _end(response)


async def _pump(stream: TokenStream, streams: ChoiceStreams, response: web.StreamResponse) -> None:
    """Send each token's text as the engine samples it (the role chunks first)."""
    for opening in streams.opening():
        await _send(response, opening)
    async for event in stream.tokens():
        chunk = streams.token(event.row, event.token_id, event.logprob)
        if chunk is not None:
            await _send(response, chunk)


async def _fail(response: web.StreamResponse, exc: Exception) -> web.StreamResponse:
    """After the headers: the error as OpenAI's JSON body in the stream (a 409 for a session committed
    meanwhile, else a 500), then the end."""
    error = exc if isinstance(exc, ApiError) else ApiError(500, f"{type(exc).__name__}: {exc}")
    await _send(response, error.body())
    return await _end(response)


async def _end(response: web.StreamResponse) -> web.StreamResponse:
    await _send(response, "[DONE]")
    await response.write_eof()
    return response
