"""Retried completions (the Idempotency-Key header) in process, on the real tiny model and a real
SQLite history: a retry whose answer was lost gets the recorded response, across a proxy restart
too, and the session stays one chain; a key sent with another request, or in flight, is refused."""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from services.explorer.serve import feedback as F
from services.explorer.serve.history import load_turns
from tests.unit.explorer.serve.test_app import Proxy

QUESTION = [{"role": "user", "content": "1+2="}]


async def ask(client: TestClient, messages: list[dict[str, Any]], key: str, **body: Any) -> Any:
    headers = {"X-Session-Id": "s", "Idempotency-Key": key}
    payload = {"model": "m", "messages": messages, "max_tokens": 4, "logprobs": True, **body}
    return await client.post("/v1/chat/completions", json=payload, headers=headers)


def turn_two(first: dict[str, Any]) -> list[dict[str, Any]]:
    said = first["choices"][0]["message"]["content"]
    return [*QUESTION, {"role": "assistant", "content": said}, {"role": "user", "content": "?"}]


async def test_a_retry_after_a_restart_gets_the_recorded_turns_and_the_session_stays_one_chain(
    tmp_path: pathlib.Path,
) -> None:
    before = Proxy(tmp_path)
    async with TestClient(TestServer(before.app)) as client:
        first = await (await ask(client, QUESTION, "s-t1")).json()
        second = await (await ask(client, turn_two(first), "s-t2")).json()
    before.close()  # the proxy "crashed" after recording turn 2; its agent never saw the answer
    after = Proxy(tmp_path)  # the same history file
    try:
        async with TestClient(TestServer(after.app)) as client:
            again = await ask(client, turn_two(first), "s-t2")
            replayed = await again.json()
            assert again.status == 200 and again.headers["X-Model-Version"] == "0"
            for key in ("id", "choices", "usage", "model_version"):
                assert replayed[key] == second[key]  # the same reply, logprobs included
            streamed = await ask(client, QUESTION, "s-t1", stream=True)
            events = [line[6:] for line in (await streamed.text()).splitlines() if line.startswith("data: ")]
            chunks = [json.loads(e) for e in events[:-1]]
            assert events[-1] == "[DONE]" and {c["id"] for c in chunks} == {first["id"]}
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
            assert text == first["choices"][0]["message"]["content"]
            stats = await (await client.get("/stats")).json()
        turns = await after.history.run(load_turns, "s")
        assert [t.response_id for t in turns] == [first["id"], second["id"]]  # nothing sampled again
        assert turns[1].parent_id == turns[0].turn_id
        assert stats["counters"]["completions"] == 2 and stats["counters"]["completions_replayed"] == 2
        await after.history.run(F.apply_feedback, F.parse_feedback({"session_id": "s", "reward": 1.0}), 1.0)
        reply, _ = await after.history.run(F.commit, F.CommitRequest(["s"], None), 1, 2.0)
        assert reply["committed"][0]["experiences"] == 1 and reply["committed"][0]["splits"] == 0
    finally:
        after.close()


async def test_a_key_sent_with_another_request_is_a_409_and_changes_nothing(tmp_path: pathlib.Path) -> None:
    p = Proxy(tmp_path)
    try:
        async with TestClient(TestServer(p.app)) as client:
            first = await (await ask(client, QUESTION, "k")).json()
            other = await ask(client, [{"role": "user", "content": "5+5="}], "k")
            error = (await other.json())["error"]
            assert other.status == 409 and error["code"] == "idempotency_key_reused"
            assert error["param"] == "Idempotency-Key"
            bad = await ask(client, QUESTION, "has space")
            assert bad.status == 400 and "Idempotency-Key" in (await bad.json())["error"]["message"]
        assert [t.response_id for t in await p.history.run(load_turns, "s")] == [first["id"]]
    finally:
        p.close()


async def test_a_retry_while_its_key_is_still_generating_is_a_409_then_the_recorded_answer(
    tmp_path: pathlib.Path,
) -> None:
    p = Proxy(tmp_path)
    try:
        async with TestClient(TestServer(p.app)) as client:
            started, release = p.hold_generation()
            first = asyncio.create_task(ask(client, QUESTION, "slow"))
            await asyncio.to_thread(started.wait, 30)
            early = await ask(client, QUESTION, "slow")
            assert early.status == 409 and (await early.json())["error"]["code"] == "idempotency_key_in_use"
            release.set()
            answered = await (await first).json()
            later = await (await ask(client, QUESTION, "slow")).json()
            assert later["id"] == answered["id"]
            assert (await (await client.get("/stats")).json())["in_flight"] == 0
        assert len(await p.history.run(load_turns, "s")) == 1
    finally:
        p.close()
