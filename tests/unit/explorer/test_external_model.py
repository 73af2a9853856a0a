"""ExternalChatModel against a real OpenAI-compatible server on loopback: the explorer's own OpenAI API
(openai_server.py) serving the builtin tiny model, so the remote replies can be checked against what
the local wrapper samples greedily."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from services.common.config import validate_config
from services.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from services.explorer.build import build_pool, build_runner
from services.explorer.external_model import ExternalChatModel
from services.explorer.openai_server import OpenAIServer
from services.explorer.runner import VersionRef
from services.models.loading import load_tokenizer

MODEL = {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 16, "max_response_tokens": 4}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Any, str]]:
    cfg = validate_config({"model": MODEL})
    tokenizer = load_tokenizer(cfg.model.model_path)
    wrapper = build_runner(cfg, build_pool(cfg, tokenizer), tokenizer, VersionRef(0), [])._all[0].wrapper
    server = OpenAIServer(wrapper, port=0, api_key="sk-test")
    server.start()
    try:
        yield wrapper, server.base_url
    finally:
        server.stop()


def test_chat_and_generate_return_the_servers_greedy_text(served: tuple[Any, str]) -> None:
    local, url = served
    remote = ExternalChatModel(url, "tiny", api_key="sk-test", max_response_tokens=4)
    messages = [{"role": "user", "content": "12+34="}]
    (reply,) = remote.chat(messages, temperature=0.0, max_tokens=4)
    (expected,) = local.chat(messages, temperature=0.0, max_tokens=4)
    assert reply.response_text == expected.response_text
    assert (
        reply.tokens.size == 0
        and reply.model_version == 0
        and reply.messages[-1].content == reply.response_text
    )
    reply.validate()  # a chat-only experience: valid for eval, never trained on
    (text,) = remote.generate("12+34=", temperature=0.0, max_tokens=3)
    (expected_text,) = local.generate("12+34=", temperature=0.0, max_tokens=3)
    assert text.response_text == expected_text.response_text and text.prompt_text == "12+34="
    assert len(asyncio.run(remote.chat_async(messages, n=3, temperature=1.0))) == 3


def test_errors_name_the_key(served: tuple[Any, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = served
    with pytest.raises(FailedPrecondition, match="HTTP 401"):  # the server asks for the key
        ExternalChatModel(url, "tiny", api_key="wrong").chat([{"role": "user", "content": "1+1="}])
    remote = ExternalChatModel(url, "tiny", api_key="sk-test")
    with pytest.raises(InvalidArgument, match="unknown rollout args \\['beam_width'\\]"):
        remote.chat([{"role": "user", "content": "1"}], beam_width=2)
    with pytest.raises(FailedPrecondition, match="model.external_model: a remote chat API takes no token-id"):
        remote.generate_tokens([1, 2])
    with pytest.raises(Unavailable, match="cannot reach http://127.0.0.1:9/v1"):
        ExternalChatModel("http://127.0.0.1:9/v1", "tiny").chat([{"role": "user", "content": "1"}])
    cfg = validate_config(
        {"mode": "bench", "model": {**MODEL, "external_model": {"enable": True, "base_url_env": "EXT_URL"}}}
    )
    monkeypatch.delenv("EXT_URL", raising=False)
    with pytest.raises(
        FailedPrecondition, match="model.external_model.base_url_env: the environment variable EXT_URL"
    ):
        ExternalChatModel.from_config(cfg.model)
    monkeypatch.setenv("EXT_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    built = ExternalChatModel.from_config(cfg.model)
    assert (built.base_url, built.model_name, built.api_key) == (url, "builtin:tiny-arith", "sk-test")
