"""The completion path of the proxy: render, link to the session, generate, record, answer.

A request is validated (protocol.py), rendered by the chat template (ModelWrapper.render_chat:
tools, enable_thinking, chat_template_kwargs), linked to its session's turns (chains.py), checked
against model.max_prompt_tokens, generated on one engine under one version (gate.py), recorded in
the history (history.py), then answered. Everything that can refuse a request does so before
the history changes; the history changes before the answer leaves.

A request with an `Idempotency-Key` header that the history already knows is answered with the
response recorded for it (same id, text, version), not sampled again: an agent that retries after
its answer was lost (the proxy killed between the record and the answer, a timeout) gets one turn,
not a second chain that would carry the session's reward for a reply it never saw.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa

from services.common.errors import TrinityError
from services.explorer.engines.base import GenerationOutput, SamplingParams
from services.explorer.openai_server import reply_message, template_messages
from services.explorer.serve import history as H
from services.explorer.serve.chains import Turn, link
from services.explorer.serve.gate import EngineGate, pick
from services.explorer.serve.protocol import IDEMPOTENCY_HEADER, ApiError, Choice, CompletionRequest
from services.explorer.text import encode_plain


@dataclass
class Prepared:
    """A request that passed every check: its ids, what the engine is given, where it goes in the session."""

    response_id: str
    session_id: str
    text: str
    """The rendered conversation (chat) or the prompt."""
    ids: np.ndarray
    parent: str | None
    split: bool
    key: str | None = None
    """The request's Idempotency-Key, recorded with its turns."""
    replay: list[Turn] | None = None
    """The turns recorded for this Idempotency-Key already: answered again, nothing generated."""


@dataclass
class Completion:
    """What a response is built from."""

    response_id: str
    version: int
    choices: list[Choice]
    usage: dict[str, int]


def _closed(row: Any) -> ApiError:
    if row.state == "expired":
        return ApiError(
            410, f"session {row.session_id!r} expired; start a new session id", param="session_id"
        )
    return ApiError(
        409, f"session {row.session_id!r} is committed; start a new session id", param="session_id"
    )


def session_turns(conn: sa.Connection, sid: str) -> list[Turn]:
    """The turns of an open session (none for a new one); a closed session is refused."""
    row = H.session_row(conn, sid)
    if row is not None and row.state != "open":
        raise _closed(row)
    return H.load_turns(conn, sid)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(
    conn: sa.Connection, session_id: str | None, rid: str, key: str | None, text: str
) -> tuple[list[Turn], list[Turn] | None]:
    """(the turns of the request's open session, the turns already recorded for its Idempotency-Key).
    A key is bound to the session and the rendered conversation it was first sent with."""
    if key is not None:
        row = conn.execute(sa.select(H.REQUEST_KEYS).where(H.REQUEST_KEYS.c.key == key)).first()
        if row is not None:
            if (session_id or row.response_id) != row.session_id or _sha256(text) != row.context_sha256:
                raise ApiError(
                    409,
                    f"{IDEMPOTENCY_HEADER} {key!r} was sent with another request (session {row.session_id!r}): "
                    "a retry must repeat its request as it was; a new request needs a new key",
                    param=IDEMPOTENCY_HEADER,
                    code="idempotency_key_reused",
                )
            H.bump(conn, "completions_replayed")
            return [], H.response_turns(conn, row.response_id)
    return session_turns(conn, session_id or rid), None


def record_turns(
    conn: sa.Connection, sid: str, turns: list[Turn], split: bool, now: float, key: str | None = None
) -> None:
    row = H.session_row(conn, sid)
    if row is None:
        conn.execute(
            sa.insert(H.SESSIONS).values(
                session_id=sid, state="open", splits=int(split), created=now, last_active=now
            )
        )
        H.bump(conn, "sessions_opened")
    elif row.state != "open":
        raise _closed(row)
    else:
        conn.execute(
            sa.update(H.SESSIONS)
            .where(H.SESSIONS.c.session_id == sid)
            .values(last_active=now, splits=row.splits + int(split))
        )
    conn.execute(sa.insert(H.TURNS), [H.turn_row(t) for t in turns])
    if key is not None:
        first = turns[0]
        conn.execute(
            sa.insert(H.REQUEST_KEYS).values(
                key=key,
                session_id=sid,
                response_id=first.response_id,
                context_sha256=_sha256(first.context_text),
            )
        )
    H.bump(conn, "completions")
    H.bump(conn, "turns_recorded", len(turns))
    H.bump(conn, "splits", int(split))


class ServeCore:
    """The proxy's completions; `wrapper` renders prompts (a ModelWrapper), gates hold the engines."""

    def __init__(
        self,
        *,
        wrapper: Any,
        gates: list[EngineGate],
        history: H.History,
        max_prompt_tokens: int,
        max_concurrent: int,
    ) -> None:
        self.wrapper = wrapper
        self.tokenizer = wrapper.tokenizer
        self.gates = gates
        self.history = history
        self.max_prompt_tokens = max_prompt_tokens
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self._keys: set[str] = set()  # the Idempotency-Keys of the requests in flight

    def admit(self, key: str | None = None) -> None:
        """Take a slot for one completion or refuse with 429 (explorer.serve.max_concurrent_requests);
        a request whose Idempotency-Key is in flight already is a 409 (retry once that one is done)."""
        if key is not None and key in self._keys:
            raise ApiError(
                409,
                f"a request with {IDEMPOTENCY_HEADER} {key!r} is being answered; retry when it is done",
                param=IDEMPOTENCY_HEADER,
                code="idempotency_key_in_use",
            )
        if self.in_flight >= self.max_concurrent:
            raise ApiError(
                429,
                f"{self.in_flight} completions are generating, the most explorer.serve.max_concurrent_requests "
                "allows; retry shortly",
                code="rate_limit_exceeded",
            )
        self.in_flight += 1
        if key is not None:
            self._keys.add(key)

    def release(self, key: str | None = None) -> None:
        self.in_flight -= 1
        self._keys.discard(key or "")

    def render(self, request: CompletionRequest) -> str:
        if not request.chat:
            return request.prompt
        try:
            return str(
                self.wrapper.render_chat(
                    template_messages(request.messages), request.tools, request.template_kwargs
                )
            )
        except TrinityError as exc:
            raise ApiError(400, str(exc), param=exc.field or "messages") from exc
        except Exception as exc:  # noqa: BLE001 - a template that fails on these messages is the request's fault
            raise ApiError(
                400, f"the chat template failed on these messages: {exc}", param="messages"
            ) from exc

    def prompt_ids(self, turns: list[Turn], text: str) -> tuple[np.ndarray, str | None, bool]:
        """(ids for the engine, the turn they extend, whether the session was split)."""
        found = link(turns, text)
        new = np.asarray(
            encode_plain(self.tokenizer, found.new_text) if found.new_text else [], dtype=np.int64
        )
        if found.parent is None:
            ids = new
        else:
            ids = np.concatenate([found.parent.prompt_ids, found.parent.response_ids, new]).astype(np.int64)
        if len(ids) == 0:
            raise ApiError(400, "the prompt is empty after tokenization", param="messages")
        if len(ids) > self.max_prompt_tokens:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens, more than model.max_prompt_tokens {self.max_prompt_tokens}",
                param="messages",
                code="context_length_exceeded",
            )
        parent = found.parent.turn_id if found.parent else None
        return ids, parent, found.parent is None and bool(turns)

    async def prepare(self, request: CompletionRequest) -> Prepared:
        """Everything that can refuse the request, before any generation: render, link, check the prompt."""
        rid = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex}"
        text = self.render(request)
        key = request.idempotency_key
        turns, replay = await self.history.run(lookup, request.session_id, rid, key, text)
        if replay:
            first = replay[0]
            return Prepared(
                first.response_id, first.session_id, text, first.prompt_ids, None, False, key, replay
            )
        ids, parent, split = self.prompt_ids(turns, text)
        return Prepared(rid, request.session_id or rid, text, ids, parent, split, key)

    async def complete(self, request: CompletionRequest, prepared: Prepared | None = None) -> Completion:
        """Generate (on the least busy engine, under one version), record, answer; or answer again
        what an Idempotency-Key already recorded."""
        prepared = prepared or await self.prepare(request)
        if prepared.replay:
            turns = prepared.replay
            return self._completion(prepared.response_id, turns[0].version, len(prepared.ids), turns, request)
        gate = pick(self.gates)
        async with gate.serving() as version:
            params = SamplingParams(**request.sampling)
            outputs = (await gate.engine.generate_async([prepared.ids.tolist()], params))[0]
        return await self.record(prepared, request, version, outputs)

    async def record(
        self, prepared: Prepared, request: CompletionRequest, version: int, outputs: list[GenerationOutput]
    ) -> Completion:
        """Record the engine's outputs as the session's turns (history), then build the response."""
        p = prepared
        new_turns = [
            self._turn(
                f"{p.response_id}/{i}",
                p.response_id,
                p.session_id,
                p.parent,
                p.ids,
                out,
                version,
                p.text,
                request,
            )
            for i, out in enumerate(outputs)
        ]
        await self.history.run(record_turns, p.session_id, new_turns, p.split, time.time(), p.key)
        return self._completion(p.response_id, version, len(p.ids), new_turns, request)

    def _completion(
        self, rid: str, version: int, prompt_tokens: int, turns: list[Turn], request: CompletionRequest
    ) -> Completion:
        choices = [self._choice(turn, request) for turn in turns]
        completion = sum(len(t.response_ids) for t in turns)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
        return Completion(rid, version, choices, usage)

    def reshapes(self, request: CompletionRequest) -> bool:
        """Whether a chat reply's message may differ from its text (reasoning split off, tool calls
        parsed): such replies cannot be streamed before they are complete."""
        if not request.chat:
            return False
        reasoning = getattr(self.wrapper, "reasoning_parser", None) == "deepseek_r1"
        tools = bool(request.tools) and getattr(self.wrapper, "tool_call_parser", None) == "hermes"
        return reasoning or tools

    def _decode(self, ids: np.ndarray, *, special: bool) -> str:
        return str(self.tokenizer.decode(ids.tolist(), skip_special_tokens=not special))

    def _turn(
        self,
        turn_id: str,
        rid: str,
        sid: str,
        parent: str | None,
        prompt: np.ndarray,
        out: GenerationOutput,
        version: int,
        text: str,
        request: CompletionRequest,
    ) -> Turn:
        response = np.asarray(out.response_ids, dtype=np.int64)
        stopped = out.finish_reason == "stop" and len(response) > 0  # the last token is the EOS
        return Turn(
            turn_id=turn_id,
            response_id=rid,
            session_id=sid,
            parent_id=parent,
            prompt_ids=prompt,
            response_ids=response,
            logprobs=np.asarray(out.logprobs, dtype=np.float32),
            version=version,
            context_text=text,
            reply_text=self._decode(response, special=True),
            reply_open_text=self._decode(response[:-1], special=True) if stopped else None,
            response_text=self._decode(response, special=False),
            finish_reason=out.finish_reason,
            messages=request.messages,
            sampling=(request.temperature, request.top_p, request.top_k),
        )

    def _choice(self, turn: Turn, request: CompletionRequest) -> Choice:
        ids = turn.response_ids.tolist()
        tokens = [str(t) for t in self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)]
        pieces = self._pieces(ids, turn.response_text) if request.stream else [turn.response_text]
        message = None
        finish = turn.finish_reason
        if request.chat:
            message = reply_message(turn.response_text, self.wrapper, tools_offered=bool(request.tools))
            if message.get("tool_calls"):
                finish = "tool_calls"
        return Choice(turn.response_text, message, finish, tokens, turn.logprobs.tolist(), pieces)

    def _pieces(self, ids: list[int], text: str) -> list[str]:
        """The text in per-token increments (prefix decodes), or [text] when decoding is not prefix-stable."""
        prefixes = [
            str(p)
            for p in self.tokenizer.batch_decode(
                [ids[: j + 1] for j in range(len(ids))], skip_special_tokens=True
            )
        ]
        pieces, before = [], ""
        for prefix in prefixes:
            if not prefix.startswith(before):
                return [text]
            pieces.append(prefix[len(before) :])
            before = prefix
        return pieces if before == text else [text]
