"""The OpenAI-compatible API on loopback, and history recording that turns its calls into experiences."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from services.explorer.engines.base import BatchingEngine
from services.explorer.engines.transformers_engine import TransformersEngine, sequence_logprobs
from services.explorer.model_wrapper import ModelWrapper
from services.models.loading import load_causal_lm, load_tokenizer


@pytest.fixture
def wrapper():
    tok = load_tokenizer("builtin:tiny-arith")
    model = load_causal_lm("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    )
    w = ModelWrapper(engine, tok, max_response_tokens=6, enable_history=True, model_name="builtin:tiny-arith")
    yield w
    w.close()
    engine.close()


def test_openai_client_chat_and_history(wrapper):
    client = wrapper.get_openai_client()
    assert client.models.list().data[0].id == "builtin:tiny-arith"
    reply = client.chat.completions.create(
        model=client.model_path,
        messages=[{"role": "user", "content": "12+30="}],
        n=2,
        max_tokens=4,
        temperature=1.0,
        logprobs=True,
    )
    assert len(reply.choices) == 2 and reply.usage.prompt_tokens == len("12+30=")
    history = wrapper.extract_experience_from_history()
    assert [e.response_text for e in history] == [c.message.content for c in reply.choices]
    model = wrapper.engine.engine.model
    for exp, choice in zip(history, reply.choices, strict=True):
        assert exp.prompt_text == "12+30=" and exp.messages[-1].role == "assistant"
        assert [lp.logprob for lp in choice.logprobs.content] == pytest.approx(exp.logprobs.tolist())
        np.testing.assert_allclose(
            sequence_logprobs(model, exp.tokens.tolist(), exp.prompt_length), exp.logprobs, atol=1e-4
        )
    assert wrapper.extract_experience_from_history() == []  # extraction clears the history


def test_completions_over_plain_http(wrapper):
    body = json.dumps({"model": "m", "prompt": "7+1=", "max_tokens": 3, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{wrapper.openai_base_url}/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        payload = json.loads(response.read())
    assert payload["object"] == "text_completion" and len(payload["choices"]) == 1
    [exp] = wrapper.extract_experience_from_history()
    assert payload["choices"][0]["text"] == exp.response_text and exp.response_length <= 3
    bad = urllib.request.Request(
        f"{wrapper.openai_base_url}/chat/completions", data=b'{"messages": []', method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad, timeout=30)
    assert info.value.code == 400


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_token_id_prompts_return_the_sampled_ids_and_logprobs_as_vllm_does(wrapper):
    tok = wrapper.tokenizer
    prompts = [wrapper.tokenize("12+30="), wrapper.tokenize("7+1=")]
    payload = post(
        f"{wrapper.openai_base_url}/completions",
        {"prompt": prompts, "n": 2, "max_tokens": 4, "logprobs": 1, "return_tokens_as_token_ids": True},
    )
    history = wrapper.extract_experience_from_history()
    assert len(payload["choices"]) == len(history) == 4  # 2 prompts x n=2, in prompt order
    for i, (choice, exp) in enumerate(zip(payload["choices"], history, strict=True)):
        assert choice["index"] == i and exp.tokens[: exp.prompt_length].tolist() == prompts[i // 2]
        response = exp.tokens[exp.prompt_length :].tolist()
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in response]
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(exp.logprobs.tolist())
        pieces = [tok.decode([t]) for t in response]
        assert choice["logprobs"]["text_offset"] == [len("".join(pieces[:k])) for k in range(len(pieces))]
    # one prompt as a flat list of ids; tokens as text without return_tokens_as_token_ids
    payload = post(
        f"{wrapper.openai_base_url}/completions", {"prompt": prompts[1], "max_tokens": 3, "logprobs": 0}
    )
    [exp] = wrapper.extract_experience_from_history()
    assert exp.tokens[: exp.prompt_length].tolist() == prompts[1]
    response = exp.tokens[exp.prompt_length :].tolist()
    assert payload["choices"][0]["logprobs"]["tokens"] == [tok.decode([t]) for t in response]


def test_content_parts_and_tool_call_arguments_reach_the_template_as_vllm_prepares_them(wrapper):
    client = wrapper.get_openai_client()
    client.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "12+"}, {"type": "text", "text": "30="}]},
        ],
        max_tokens=2,
    )
    [exp] = wrapper.extract_experience_from_history()
    assert exp.prompt_text == "12+\n30=" and exp.messages[0].content == "12+\n30="
    with pytest.raises(Exception, match="only text parts are supported") as info:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        )
    assert getattr(info.value, "status_code", None) == 400
    # a template that prints the arguments' type sees the object, not its JSON string
    wrapper.chat_template = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{{ c.function.arguments is mapping }}:{{ c.function.arguments.x }}{% endfor %}{% endfor %}"
    )
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 7}'}}
    client.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": "1"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ],
        max_tokens=1,
    )
    [exp] = wrapper.extract_experience_from_history()
    assert exp.prompt_text == "True:7"
