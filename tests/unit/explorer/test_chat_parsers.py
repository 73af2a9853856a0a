"""The OpenAI API's reply parsers: hermes tool calls and deepseek_r1 reasoning (vLLM's formats),
and the config keys that turn them on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from services.common.config import validate_config
from services.common.errors import ConfigError
from services.explorer.chat_parsers import parse_hermes_tool_calls, split_deepseek_r1_reasoning
from services.explorer.openai_server import reply_message


def test_hermes_blocks_become_tool_calls() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "gsm8k"}}\n</tool_call>'
    content, calls = parse_hermes_tool_calls(text)
    assert content == "Let me look."
    assert len(calls) == 1 and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "search"
    assert json.loads(calls[0]["function"]["arguments"]) == {"q": "gsm8k"}


def test_a_broken_hermes_block_stays_in_the_content() -> None:
    text = "<tool_call>{not json}</tool_call>"
    assert parse_hermes_tool_calls(text) == (text, [])


def test_deepseek_r1_reasoning_split() -> None:
    assert split_deepseek_r1_reasoning("<think>2+2 is 4</think>\n\nThe answer is 4.") == (
        "2+2 is 4",
        "The answer is 4.",
    )
    assert split_deepseek_r1_reasoning("still thinking") == ("still thinking", "")  # cut off while thinking


def test_reply_message_applies_the_configured_parsers() -> None:
    wrapper = SimpleNamespace(tool_call_parser="hermes", reasoning_parser="deepseek_r1")
    text = '<think>need a tool</think><tool_call>{"name": "calc", "arguments": "{\\"x\\": 1}"}</tool_call>'
    message = reply_message(text, wrapper, tools_offered=True)
    assert message["reasoning_content"] == "need a tool"
    assert message["content"] is None and message["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    # no tools in the request: the text is not parsed for calls; no parsers: the text as it is
    assert "tool_calls" not in reply_message(text, wrapper, tools_offered=False)
    plain = reply_message(text, SimpleNamespace(), tools_offered=True)
    assert plain == {"role": "assistant", "content": text}


def test_tool_choice_needs_a_parser_and_the_reverse() -> None:
    cfg = validate_config(
        {"explorer": {"rollout_model": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}}}
    )
    assert cfg.explorer.rollout_model.tool_call_parser == "hermes"
    with pytest.raises(ConfigError, match="enable_auto_tool_choice needs tool_call_parser"):
        validate_config({"explorer": {"rollout_model": {"enable_auto_tool_choice": True}}})
    with pytest.raises(ConfigError, match="tool_call_parser is used only with enable_auto_tool_choice"):
        validate_config({"explorer": {"rollout_model": {"tool_call_parser": "hermes"}}})
    with pytest.raises(ConfigError, match="tool_call_parser"):
        validate_config(
            {"explorer": {"rollout_model": {"enable_auto_tool_choice": True, "tool_call_parser": "mistral"}}}
        )
