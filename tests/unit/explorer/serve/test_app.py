"""The proxy's HTTP layer in process, on the real tiny model and a real SQLite history: the
concurrency limit, the bearer token, and new weights loaded only between requests."""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from services.explorer.engines.base import BatchingEngine
from services.explorer.engines.transformers_engine import TransformersEngine, sequence_logprobs
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.serve.app import make_app
from services.explorer.serve.commits import Commits
from services.explorer.serve.core import ServeCore
from services.explorer.serve.gate import EngineGate
from services.explorer.serve.history import History, load_turns
from services.explorer.serve.protocol import Limits
from services.explorer.serve.weights import ServeWeights
from services.models.loading import load_causal_lm, load_tokenizer
from tests.fakes.serve import PlannedSync

TOKEN = "s3cret"


class Proxy:
    def __init__(self, tmp: pathlib.Path, *, max_concurrent: int = 4, token: str | None = None) -> None:
        tok = load_tokenizer("builtin:tiny-arith")
        self.model = load_causal_lm("builtin:tiny-arith")
        self.engine = TransformersEngine(
            self.model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
        )
        self.batching = BatchingEngine(self.engine)
        self.gate = EngineGate(self.batching)
        self.history = History(f"sqlite:///{tmp / 'h.db'}")
        wrapper = ModelWrapper(self.batching, tok, max_response_tokens=6)
        self.core = ServeCore(
            wrapper=wrapper,
            gates=[self.gate],
            history=self.history,
            max_prompt_tokens=64,
            max_concurrent=max_concurrent,
        )
        commits = Commits(
            self.history, None, buffer_name="exp", producer="p", group_size=1, ttl_s=60, chunk=64
        )
        self.app = make_app(
            self.core,
            commits,
            Limits(max_tokens=6, max_n=2),
            model_name="tiny",
            token=token,
            max_request_bytes=4096,
            version=lambda: self.gate.version,
        )

    def hold_generation(self) -> tuple[threading.Event, threading.Event]:
        """(started, release): the next generation blocks before its second token until released."""
        started, release = threading.Event(), threading.Event()

        def before(t: int) -> None:
            if t == 1 and not release.is_set():
                started.set()
                release.wait(30)

        self.engine.before_token = before
        return started, release

    def close(self) -> None:
        self.batching.close()
        self.history.close()


@pytest.fixture
async def proxy(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Proxy, TestClient]]:
    p = Proxy(tmp_path, max_concurrent=1)
    async with TestClient(TestServer(p.app)) as client:
        yield p, client
    p.close()


async def chat(client: TestClient, content: str = "1+2=", **headers: str) -> Any:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "logprobs": True,
    }
    return await client.post("/v1/chat/completions", json=body, headers=headers)


async def test_one_request_over_the_concurrency_limit_is_a_429_and_changes_nothing(proxy) -> None:
    p, client = proxy
    started, release = p.hold_generation()
    first = asyncio.create_task(chat(client))
    await asyncio.to_thread(started.wait, 30)
    over = await chat(client, "3+4=")
    body = await over.json()
    assert over.status == 429 and body["error"]["type"] == "rate_limit_error"
    release.set()
    assert (await first).status == 200
    stats = await (await client.get("/stats")).json()
    assert stats["counters"]["completions"] == 1 and stats["in_flight"] == 0


async def test_weights_change_only_between_requests(proxy) -> None:
    p, client = proxy
    new = {name: tensor + 0.05 * torch.randn_like(tensor) for name, tensor in p.model.state_dict().items()}
    old = {name: tensor.clone() for name, tensor in p.model.state_dict().items()}
    sync = PlannedSync({1: 1}, {1: new})
    weights = ServeWeights([p.gate], sync, sync)
    started, release = p.hold_generation()
    during = asyncio.create_task(chat(client))
    await asyncio.to_thread(started.wait, 30)
    loading = asyncio.create_task(weights.check())
    await asyncio.sleep(0.2)
    assert p.gate.loading and not loading.done()  # the load waits for the request in flight
    assert torch.equal(p.model.state_dict()["lm_head.weight"], old["lm_head.weight"])
    release.set()
    reply = await (await during).json()
    assert await loading == 1 and reply["model_version"] == 0
    after = await (await chat(client, "5+6=")).json()
    assert after["model_version"] == 1 and weights.version == 1
    # each reply's logprobs are those of the weights it names: the old model's, then the new one's
    [turn] = await p.history.run(load_turns, after["id"])  # no session id: the response is its session
    tokens = np.concatenate([turn.prompt_ids, turn.response_ids]).tolist()
    np.testing.assert_allclose(
        sequence_logprobs(p.model, tokens, len(turn.prompt_ids)), turn.logprobs, atol=1e-4
    )
    p.model.load_state_dict(old)
    [before] = await p.history.run(load_turns, reply["id"])
    tokens = np.concatenate([before.prompt_ids, before.response_ids]).tolist()
    np.testing.assert_allclose(
        sequence_logprobs(p.model, tokens, len(before.prompt_ids)), before.logprobs, atol=1e-4
    )
    assert sync.reports == [(1, True)]


async def test_tools_reach_the_chat_template_and_the_recorded_prompt(proxy) -> None:
    p, client = proxy
    p.core.wrapper.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "1+2="}], "tools": [tool], "max_tokens": 2}
    reply = await (await client.post("/v1/chat/completions", json=body)).json()
    [turn] = await p.history.run(load_turns, reply["id"])
    assert turn.context_text == "1+2=[add]" and reply["usage"]["prompt_tokens"] == len("1+2=[add]")
    assert p.core.tokenizer.decode(turn.prompt_ids.tolist()) == "1+2=[add]"  # the ids the engine was given
    refused = await client.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    assert refused.status == 400 and (await refused.json())["error"]["param"] == "tool_choice"


async def test_a_chatml_style_template_that_keeps_the_eos_links_the_second_turn(proxy) -> None:
    p, client = proxy
    # as ChatML: each message closed by the EOS token and a newline, then the generation prompt
    p.core.wrapper.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    headers = {"X-Session-Id": "chatml"}
    first = await (await chat(client, "1+2=", **headers)).json()
    said = first["choices"][0]["message"]["content"]
    messages = [
        {"role": "user", "content": "1+2="},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "ok?"},
    ]
    body = {"model": "m", "messages": messages, "max_tokens": 4}
    second = await (await client.post("/v1/chat/completions", json=body, headers=headers)).json()
    one, two = await p.history.run(load_turns, "chatml")
    assert two.parent_id == one.turn_id  # no split
    head = np.concatenate([one.prompt_ids, one.response_ids]).tolist()
    assert two.prompt_ids[: len(head)].tolist() == head  # the engine's own ids, not re-tokenized
    # only the text after the reply is tokenized: the template's EOS (unless the model's own ended
    # the reply), the newline, the next message, the generation prompt
    closing = "<eos>" if one.finish_reason == "length" else ""
    new = two.prompt_ids[len(head) :].tolist()
    assert p.core.tokenizer.decode(new) == closing + "\n<user>ok?<eos>\n<assistant>"
    assert second["usage"]["prompt_tokens"] == len(two.prompt_ids)


async def test_the_bearer_token_guards_every_route_but_health(tmp_path: pathlib.Path) -> None:
    p = Proxy(tmp_path, token=TOKEN)
    try:
        async with TestClient(TestServer(p.app)) as client:
            missing, wrong = await chat(client), await chat(client, Authorization="Bearer nope")
            assert missing.status == wrong.status == 401
            assert (await wrong.json())["error"]["code"] == "invalid_api_key"
            assert (await client.get("/health")).status == 200
            assert (await chat(client, Authorization=f"Bearer {TOKEN}")).status == 200
            stats = await (await client.get("/stats", headers={"Authorization": f"Bearer {TOKEN}"})).json()
            assert stats["counters"]["completions"] == 1  # the refused ones left no trace
    finally:
        p.close()
