"""The proxy streams from the vLLM engine while it generates: the real openai SDK over a socket, the
tiny Llama in-process; the engine is held before its last token until the client has a chunk."""

from __future__ import annotations

import pathlib
import threading

import numpy as np
from aiohttp.test_utils import TestServer
from openai import AsyncOpenAI

from services.explorer.engines.base import BatchingEngine
from services.explorer.engines.stream import TokenStream
from services.explorer.engines.vllm_engine import VLLMEngine
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.serve.app import make_app
from services.explorer.serve.commits import Commits
from services.explorer.serve.core import ServeCore
from services.explorer.serve.gate import EngineGate
from services.explorer.serve.history import History, load_turns
from services.explorer.serve.protocol import Limits
from services.models.loading import builtin_tokenizer

TOKENS = 16


async def test_the_sdk_gets_vllm_s_tokens_while_it_generates(
    tiny_engine: VLLMEngine, tmp_path: pathlib.Path, monkeypatch
) -> None:
    first_chunk, waited = threading.Event(), []
    handed_out = TokenStream._on_token

    def on_token(self: TokenStream, row: int, token_id: int, logprob: float) -> None:  # the engine thread
        handed_out(self, row, token_id, logprob)
        self.count = getattr(self, "count", 0) + 1
        if self.count == TOKENS - 1:  # before the step of the last token: wait for the client
            waited.append(first_chunk.wait(30))

    monkeypatch.setattr(TokenStream, "_on_token", on_token)
    tok = builtin_tokenizer()
    batching = BatchingEngine(tiny_engine)
    history = History(f"sqlite:///{tmp_path / 'h.db'}")
    core = ServeCore(
        wrapper=ModelWrapper(batching, tok, max_response_tokens=TOKENS),
        gates=[EngineGate(batching)],
        history=history,
        max_prompt_tokens=64,
        max_concurrent=2,
    )
    commits = Commits(history, None, buffer_name="exp", producer="p", group_size=1, ttl_s=60, chunk=64)
    app = make_app(
        core,
        commits,
        Limits(max_tokens=TOKENS, max_n=1),
        model_name="tiny",
        token=None,
        max_request_bytes=4096,
        version=lambda: 0,
    )
    server = TestServer(app)
    await server.start_server()
    client = AsyncOpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="unused", max_retries=0)
    try:
        stream = await client.completions.create(
            model="m",
            prompt="12+34=",
            max_tokens=TOKENS,
            logprobs=0,
            stream=True,
            extra_body={"min_tokens": TOKENS, "session_id": "v-1"},
        )
        texts, lps, last = [], [], None
        async for chunk in stream:
            last = chunk
            for choice in chunk.choices:
                if choice.text:
                    texts.append(choice.text)
                    first_chunk.set()
                lps += choice.logprobs.token_logprobs if choice.logprobs else []
        [turn] = await history.run(load_turns, "v-1")
    finally:
        await client.close()
        await server.close()
        history.close()  # (the batching engine is left open: closing it would close the session's vLLM engine)
    assert waited == [True] and len(texts) > 1  # a chunk reached the SDK before the last token was sampled
    assert "".join(texts) == turn.response_text and len(turn.response_ids) == TOKENS
    np.testing.assert_allclose(lps, turn.logprobs, atol=1e-6)  # vLLM's, as recorded
    assert last is not None and last.id == turn.response_id and last.model_version == 0
