"""tool_call_workflow / toolcall_workflow: the Tool-N1 prompt and reward (Trinity-RFT's rule), one run on tiny-arith.

Each reward below is worked out by hand from the rule in services/explorer/workflows/tool_call.py.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.base import RolloutArgs
from services.explorer.workflows.tool_call import (
    ToolCallWorkflow,
    build_messages,
    extract_calls,
    format_tools,
    match_level,
    toolcall_reward,
)

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
EMAIL = {"name": "send_email", "description": "Send an email", "parameters": {"type": "object"}}
ANSWER = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}},
    {"name": "send_email", "arguments": {"to": "bob"}},
]
ROW = {
    "tools": json.dumps([WEATHER, EMAIL]),
    "raw_system": "You are a helpful assistant.\n",
    "conversations": [
        {"from": "human", "value": "Weather in Paris, then mail Bob."},
        {"from": "function_call", "value": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        {"from": "observation", "value": "Rome: 20C"},
        {"from": "gpt", "value": "Rome is 20C."},
        {"from": "user", "value": "Now Paris, and mail Bob."},
    ],
    "answer": json.dumps(ANSWER),
}


def calls_text(calls: Any) -> str:
    return json.dumps(calls)


def test_tools_are_one_json_line_each() -> None:
    assert format_tools(ROW["tools"]) == (
        json.dumps({"type": "function", "function": WEATHER})
        + "\n"
        + json.dumps({"type": "function", "function": EMAIL})
    )
    assert format_tools([WEATHER]) == json.dumps({"type": "function", "function": WEATHER})


def test_messages_from_a_task_row() -> None:
    messages = build_messages(ROW)
    system = messages[0]["content"]
    lines = [json.dumps({"type": "function", "function": t}) for t in (WEATHER, EMAIL)]
    assert messages[0]["role"] == "system"
    assert system.startswith(
        "You are a helpful assistant.\n# Tool\n\n<tools>\n"
        + "\n".join(lines)
        + "\n</tools>\n\nIn each action step, you MUST:\n1. Think about the reasoning process"
    )
    assert '<tool_call>[{"name": <function-name>, "arguments": <args-json-object>}, ' in system
    assert system.endswith("</tool_call>. Please make sure the type of the arguments is correct.\n")
    assert messages[1:] == [
        {"role": "user", "content": "Weather in Paris, then mail Bob."},
        {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Rome"}}'},
        {"role": "tool", "content": "Rome: 20C"},
        {"role": "assistant", "content": "Rome is 20C."},
        {"role": "user", "content": "Now Paris, and mail Bob."},
    ]
    with pytest.raises(InvalidArgument, match="conversations"):
        build_messages({"tools": "[]"})
    with pytest.raises(InvalidArgument, match="raw_task.tools is not valid JSON"):
        build_messages({"tools": "[{", "conversations": []})


REVERSED_KEYS = [
    {"name": "send_email", "arguments": {"to": "bob"}},
    {"arguments": {"unit": "C", "city": "Paris"}, "name": "get_weather"},
]


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        # think first, then every call once: order and key order do not matter
        (f"<think>plan</think><tool_call>{calls_text(REVERSED_KEYS)}</tool_call>", 1.0),
        # no think block at all
        (f"<tool_call>{calls_text(ANSWER)}</tool_call>", 0.0),
        # think after the tool call
        (f"<tool_call>{calls_text(ANSWER)}</tool_call><think>plan</think>", 0.0),
        # two think blocks
        (f"<think>a</think><think>b</think><tool_call>{calls_text(ANSWER)}</tool_call>", 0.0),
        # right functions, one wrong argument (match level 1 still scores 0)
        (
            f"<think>p</think><tool_call>{calls_text([ANSWER[0], {**ANSWER[1], 'arguments': {'to': 'al'}}])}</tool_call>",
            0.0,
        ),
        # one call missing
        (f"<think>p</think><tool_call>{calls_text(ANSWER[:1])}</tool_call>", 0.0),
        # a call without arguments is malformed
        (f'<think>p</think><tool_call>[{{"name": "get_weather"}}, {calls_text(ANSWER[1])}]</tool_call>', 0.0),
        # not JSON
        ("<think>p</think><tool_call>get_weather(city=Paris)</tool_call>", 0.0),
        # only the last block counts
        (f"<think>p</think><tool_call>{calls_text(ANSWER)}</tool_call><tool_call>[]</tool_call>", 0.0),
        # no tool call
        ("<think>p</think>It is sunny.", 0.0),
    ],
)
def test_reward_rule(reply: str, reward: float) -> None:
    assert toolcall_reward(reply, ROW["answer"]) == reward


def test_single_object_empty_lists_and_double_encoded_answers() -> None:
    one = {"name": "get_weather", "arguments": {"city": "Paris"}}
    # a single object in the block is a one-call list
    assert (
        toolcall_reward(f"<think>p</think><tool_call>{json.dumps(one)}</tool_call>", json.dumps([one])) == 1.0
    )
    # expecting no call, the model calls none: full score; calls one: 0
    assert toolcall_reward("<think>p</think><tool_call>[]</tool_call>", "[]") == 1.0
    assert toolcall_reward(f"<think>p</think><tool_call>{json.dumps([one])}</tool_call>", "[]") == 0.0
    # an answer stored as a JSON string inside JSON, or as the list itself
    reply = f"<think>p</think><tool_call>{json.dumps([one])}</tool_call>"
    assert toolcall_reward(reply, json.dumps(json.dumps([one]))) == 1.0
    assert toolcall_reward(reply, [one]) == 1.0
    # a JSON string inside the block is decoded once more
    assert extract_calls(f"<tool_call>{json.dumps(json.dumps([one]))}</tool_call>") == [one]


def test_match_levels() -> None:
    weather = {"name": "w", "arguments": {"a": 1}}
    assert match_level([weather], [{"arguments": {"a": 1}, "name": "w"}]) == 2
    assert match_level([weather], [{"name": "w", "arguments": {"a": 2}}]) == 1
    assert match_level([weather, weather], [weather]) == 0  # a multiset: counts matter
    assert match_level([], []) == 2 and match_level([], [weather]) == 0
    assert match_level([{"name": ["unhashable"], "arguments": {}}], [weather]) == 0


class CannedModel:
    """chat() answers with the canned replies (n of them); records the messages and kwargs."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.calls: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> list[Experience]:
        self.calls.append((messages, kwargs))
        return [
            Experience(tokens=np.arange(5 + len(r)), prompt_length=5, model_version=0, response_text=r)
            for r in self.replies
        ]


def make_task(name: str = "tool_call_workflow", **changes: Any) -> Task:
    task = Task(
        workflow=WORKFLOWS.get(name), raw_task=dict(ROW), rollout_args=RolloutArgs(n=2, temperature=0.9)
    )
    for key, value in changes.items():
        setattr(task, key, value)
    return task


def test_both_names_are_the_workflow() -> None:
    assert WORKFLOWS.get("tool_call_workflow") is WORKFLOWS.get("toolcall_workflow") is ToolCallWorkflow
    assert ToolCallWorkflow.can_repeat and ToolCallWorkflow.can_reset


def test_workflow_scores_every_sample() -> None:
    good = f"<think>p</think><tool_call>{calls_text(ANSWER)}</tool_call>"
    model = CannedModel([good, "no idea"])
    exps = make_task().to_workflow(model).run()
    assert model.calls == [(build_messages(ROW), {"n": 2, "temperature": 0.9})]
    assert [e.reward for e in exps] == [1.0, 0.0]
    assert [e.metrics for e in exps] == [{"accuracy": 1.0}, {"accuracy": 0.0}]
    assert exps[0].info["truth"] == ROW["answer"]


def test_reset_and_a_row_without_answer() -> None:
    workflow = make_task().to_workflow(CannedModel([]))
    row = {**ROW, "conversations": [{"from": "human", "value": "Hi"}]}
    row.pop("answer")
    model = CannedModel(["<think>p</think><tool_call>[]</tool_call>"])
    workflow.model = model
    workflow.reset(make_task(raw_task=row))
    exps = workflow.run()
    assert model.calls[0][0][1:] == [{"role": "user", "content": "Hi"}]
    assert exps[0].reward == 0.0  # nothing to compare with: 0, as in Trinity


async def test_tool_call_workflow_on_tiny_arith() -> None:
    """The tiny model cannot call tools; the run shows the plumbing through the runner."""
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.explorer.model_wrapper import ModelWrapper
    from services.explorer.runner import VersionRef, WorkflowRunner
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"), eos_token_ids=[tok.eos_token_id], pad_token_id=0
        )
    )
    engine.engine.model_version = 4  # holds version 4, as after the explorer loaded it
    try:
        # tiny-arith has 256 positions: the ~1,500-character prompt is cut from the left to 200 tokens
        wrapper = ModelWrapper(engine, tok, max_prompt_tokens=200, max_response_tokens=8)
        runner = WorkflowRunner(
            lambda i: wrapper, slots=1, max_timeout=60, max_retry_times=0, version_fn=VersionRef(4)
        )
        results = await runner.run_tasks([make_task("toolcall_workflow", repeat_times=3, task_id="t")])
        exps = [e for r in results for e in r.experiences]
        assert len(exps) == 3 and [e.run_id for e in exps] == [0, 1, 2]
        rendered = wrapper.tokenize(wrapper.render_chat(build_messages(ROW)))
        for exp in exps:
            assert exp.tokens[: exp.prompt_length].tolist() == rendered[-200:]
            assert exp.model_version == 4 and exp.reward == 0.0 and exp.metrics == {"accuracy": 0.0}
            assert 1 <= exp.response_length <= 8 and exp.action_mask.all() and (exp.logprobs <= 0).all()
    finally:
        engine.close()
