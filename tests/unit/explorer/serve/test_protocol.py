"""Request validation (every refusal names its parameter) and the stream's chunks."""

from __future__ import annotations

import pytest

from services.explorer.serve.protocol import ApiError, Choice, Limits, parse_request, stream_chunks

LIMITS = Limits(max_tokens=8, max_n=4)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refused(body: dict, *, chat: bool = True, header: str | None = None) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_request(body, LIMITS, chat=chat, session_header=header)
    return info.value


def test_defaults_and_limits() -> None:
    request = parse_request({**CHAT, "max_tokens": 8, "n": 4}, LIMITS, chat=True, session_header="s1")
    assert (request.n, request.max_tokens, request.temperature, request.session_id) == (4, 8, 1.0, "s1")
    assert (
        parse_request(CHAT, LIMITS, chat=True, session_header=None).max_tokens == 8
    )  # the limit is the default


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({**CHAT, "max_tokens": 9}, "max_tokens", "model.max_response_tokens"),
        ({**CHAT, "max_completion_tokens": 0}, "max_completion_tokens", "[1, 8]"),
        ({**CHAT, "n": 5}, "n", "explorer.serve.max_n"),
        ({**CHAT, "temperature": "hot"}, "temperature", "a number"),
        ({**CHAT, "stop": ["\n"]}, "stop", "stop sequences"),
        ({**CHAT, "top_logprobs": 2}, "top_logprobs", "sampled tokens"),
        ({**CHAT, "tool_choice": "required"}, "tool_choice", "auto and none"),
        ({**CHAT, "colour": "blue"}, "colour", "Unrecognized"),
        ({**CHAT, "session_id": "a b"}, "session_id", "letters, digits"),
        ({"model": "m", "messages": []}, "messages", "non-empty"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0]", "role"),
        ({"messages": CHAT["messages"]}, "model", "model is required"),
    ],
)
def test_each_bad_request_is_a_400_naming_its_parameter(body: dict, param: str, text: str) -> None:
    error = refused(body)
    assert error.status == 400 and error.param == param and text in error.message
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_the_session_header_and_body_must_agree() -> None:
    assert refused({**CHAT, "session_id": "a"}, header="b").param == "session_id"
    assert parse_request({**CHAT, "session_id": "a"}, LIMITS, chat=True, session_header="a").session_id == "a"


def test_text_completions_take_one_prompt_and_logprobs_0_only() -> None:
    body = {"model": "m", "prompt": "1+1=", "logprobs": 0}
    assert parse_request(body, LIMITS, chat=False, session_header=None).logprobs
    assert refused({"model": "m", "prompt": ["a", "b"]}, chat=False).param == "prompt"
    assert refused({**body, "logprobs": 3}, chat=False).param == "logprobs"
    assert refused({**body, "messages": []}, chat=False).param == "messages"  # a chat key on /v1/completions


def test_a_stream_sends_the_text_token_by_token_then_the_finish_then_the_usage() -> None:
    request = parse_request(
        {**CHAT, "stream": True, "logprobs": True, "stream_options": {"include_usage": True}},
        LIMITS,
        chat=True,
        session_header=None,
    )
    choice = Choice(
        "ab", {"role": "assistant", "content": "ab"}, "stop", ["a", "b"], [-0.5, -1.0], ["a", "b"]
    )
    chunks = stream_chunks(
        "id1", request, 3, [choice], {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    )
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "a"}, {"content": "b"}, {}]
    assert [c["choices"][0]["logprobs"]["content"][0]["logprob"] for c in chunks[1:3]] == [-0.5, -1.0]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 3
    assert {c["id"] for c in chunks} == {"id1"} and {c["model_version"] for c in chunks} == {3}


def test_a_parsed_tool_call_streams_as_one_chunk() -> None:
    request = parse_request({**CHAT, "stream": True}, LIMITS, chat=True, session_header=None)
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    choice = Choice("<tool_call>...", message, "tool_calls", ["<", "t"], [-1.0, -1.0], ["<", "t"])
    chunks = stream_chunks("id1", request, 0, [choice], {})
    assert chunks[1]["choices"][0]["delta"] == {"tool_calls": [{"index": 0, **call}]}
    assert chunks[2]["choices"][0]["finish_reason"] == "tool_calls" and len(chunks) == 3
