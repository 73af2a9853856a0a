"""Streamed completions in process: the real tiny model, a real SQLite history, the real `openai`
SDK over a real socket; the engine's per-token hook shows the chunks leave while it generates."""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import openai
import pytest
from aiohttp.test_utils import TestServer
from openai import AsyncOpenAI

from services.explorer.serve.history import load_turns
from services.explorer.serve.streaming import IncrementalText
from tests.fakes.serve import ByteTokenizer
from tests.unit.explorer.serve.test_app import Proxy

TOKENS = 6  # the tiny proxy's max_tokens; min_tokens = TOKENS: every request samples all six


@pytest.fixture
async def served(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Proxy, AsyncOpenAI]]:
    p = Proxy(tmp_path)
    server = TestServer(p.app)
    await server.start_server()
    client = AsyncOpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="unused", max_retries=0)
    yield p, client
    await client.close()
    await server.close()
    p.close()


def test_held_back_text_comes_out_once_its_character_is_complete() -> None:
    text = IncrementalText(ByteTokenizer())
    euro = list("€".encode())  # three bytes, three tokens
    pushed = [text.push(b) for b in [ord("a"), *euro]]
    assert pushed == [("a", [0]), ("", []), ("", []), ("€", [1, 2, 3])]  # the character once whole
    assert text.push(256) == ("", [])  # the EOS has no text: held until the end
    assert text.finish("a€") == ("", [4]) and text.sent == "a€"
    with pytest.raises(ValueError, match="does not begin"):
        text.finish("b")


async def test_the_sdk_gets_chunks_while_the_engine_generates_and_they_add_up_to_the_record(served) -> None:
    p, client = served
    first_chunk = threading.Event()
    steps: dict[int, float] = {}
    waited_for_client: list[bool] = []

    def before(t: int) -> None:  # the engine thread, before sampling token t
        if t == TOKENS - 1:  # the last token waits (at most 10 s) until the client holds a chunk
            waited_for_client.append(first_chunk.wait(10))
        steps[t] = time.monotonic()

    p.engine.before_token = before
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "12+30="}],
        max_tokens=TOKENS,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": TOKENS, "session_id": "st-1"},
    )
    chunks, arrived = [], []
    async for chunk in stream:
        chunks.append(chunk)
        arrived.append(time.monotonic())
        if chunk.choices and chunk.choices[0].delta.content:
            first_chunk.set()
    content = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content]
    assert len(content) > 1  # token by token, not one piece
    # the first text chunk reached the SDK before the engine sampled the last token
    assert waited_for_client == [True] and arrived[content[0]] < steps[TOKENS - 1]
    [turn] = await p.history.run(load_turns, "st-1")
    text = "".join(chunks[i].choices[0].delta.content for i in content)
    assert (
        text
        == turn.response_text
        == p.core.tokenizer.decode(turn.response_ids.tolist(), skip_special_tokens=True)
    )
    streamed_lps = [
        lp.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for lp in c.choices[0].logprobs.content
    ]
    np.testing.assert_allclose(streamed_lps, turn.logprobs, atol=1e-6)  # the engine's, in order
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finish] == ["length"]
    last = chunks[-1]  # the usage chunk, after the finish
    assert last.usage.completion_tokens == TOKENS == len(turn.response_ids)
    for chunk in (finish[0], last):
        assert chunk.id == turn.response_id and chunk.model_version == 0
        assert chunk.system_fingerprint == "trinity-grpc-v0"


async def test_streamed_text_completions_keep_each_choice_apart(served) -> None:
    p, client = served
    stream = await client.completions.create(
        model="m", prompt="7+5=", max_tokens=4, n=2, stream=True, extra_body={"session_id": "st-2"}
    )
    texts, finishes = ["", ""], [None, None]
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    turns = await p.history.run(load_turns, "st-2")
    assert texts == [t.response_text for t in turns]
    assert finishes == [t.finish_reason for t in turns]


async def test_an_engine_failure_mid_stream_is_an_error_event_and_records_nothing(served) -> None:
    p, client = served

    def before(t: int) -> None:
        if t == 2:
            raise RuntimeError("the engine fell over")

    p.engine.before_token = before
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "1+1="}],
        max_tokens=TOKENS,
        stream=True,
        extra_body={"min_tokens": TOKENS, "session_id": "st-3"},
    )
    with pytest.raises(openai.APIError, match="the engine fell over"):
        async for _chunk in stream:
            pass
    assert await p.history.run(load_turns, "st-3") == [] and p.core.in_flight == 0
