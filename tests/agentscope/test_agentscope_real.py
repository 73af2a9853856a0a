"""AgentScope workflows for real: agentscope 1.x agents on `builtin:tiny-arith`, every call recorded as an experience.

The tiny model never emits a tool call (no tool-call parser is configured), so a ReAct agent runs all
its reasoning steps and then its summary call; its structured reply never comes, and the gsm8k
reward is 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from services.common.config.buffer import FormatConfig
from services.explorer.engines.base import BatchingEngine
from services.explorer.engines.transformers_engine import TransformersEngine
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.agentscope_react import GSM8K_SYSTEM_PROMPT, MATH_REACT_SYSTEM_PROMPT
from services.explorer.workflows.agentscope_support import content_text
from services.explorer.workflows.base import RolloutArgs
from services.models.loading import load_causal_lm, load_tokenizer

REACT_MAX_ITERS = 10  # agentscope's ReActAgent default, which Trinity's react_agent keeps


@pytest.fixture
def engine_and_tokenizer() -> Iterator[tuple[BatchingEngine, Any]]:
    tok = load_tokenizer("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"),
            eos_token_ids=[tok.eos_token_id],
            pad_token_id=tok.pad_token_id,
        )
    )
    yield engine, tok
    engine.close()


def wrapper_factory(engine: BatchingEngine, tok: Any):
    # 200 prompt + 8 reply tokens fit the model's 256 positions
    return lambda i: ModelWrapper(
        engine, tok, max_prompt_tokens=200, max_response_tokens=8, enable_history=True, model_name="tiny"
    )


async def test_react_workflow_runs_an_agentscope_agent(engine_and_tokenizer) -> None:
    engine, tok = engine_and_tokenizer
    engine.engine.model_version = 4  # holds version 4, as after the explorer loaded it
    runner = WorkflowRunner(
        wrapper_factory(engine, tok), slots=2, max_timeout=120, max_retry_times=0, version_fn=VersionRef(4)
    )
    task = Task(
        workflow=WORKFLOWS.get("as_react_workflow"),
        repeat_times=2,
        raw_task={"question": "12+30=", "answer": "It is 42.\n#### 42"},
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=RolloutArgs(temperature=1.0),
        workflow_args={"type": "gsm8k"},
        task_id="t0",
    )
    try:
        [first, second] = await runner.run_tasks([task])
    finally:
        runner.close()
    for result, run_id in ((first, 0), (second, 1)):
        assert not result.skipped, result.errors
        exps = result.experiences
        assert len(exps) == REACT_MAX_ITERS + 1  # every reasoning step, then the summary
        system, user = exps[0].messages[:2]
        assert (system.role, content_text(system.content)) == ("system", GSM8K_SYSTEM_PROMPT)
        assert (user.role, content_text(user.content)) == ("user", "12+30=")
        carried = 0
        for earlier, later in pairwise(exps):
            # each call's prompt carries the agent's memory, so the previous reply is in it (a reply
            # that sampled EOS first is empty: the agent keeps no message for it)
            replies = [content_text(m.content) for m in later.messages[:-1] if m.role == "assistant"]
            if earlier.response_text:
                assert earlier.response_text in replies
                carried += 1
        assert carried >= REACT_MAX_ITERS // 2
        for step, exp in enumerate(exps):
            assert exp.reward == 0.0 and exp.metrics["accuracy"] == 0.0 and exp.metrics["format_score"] == 0.0
            assert exp.step == step and exp.run_id == run_id and exp.model_version == 4
            assert (
                exp.metrics["react_memory_length"]
                == exps[-1].metrics["react_memory_length"]
                > REACT_MAX_ITERS
            )
            assert exp.logprobs is not None and len(exp.logprobs) == exp.response_length <= 8
            assert np.all(exp.logprobs <= 0)


async def test_react_math_workflow_with_its_python_tool(engine_and_tokenizer) -> None:
    """agentscope_react_math_workflow: resettable, so one workflow serves both runs (reset between)."""
    engine, tok = engine_and_tokenizer
    engine.engine.model_version = 1  # holds version 1, as after the explorer loaded it
    runner = WorkflowRunner(
        wrapper_factory(engine, tok), slots=1, max_timeout=120, max_retry_times=0, version_fn=VersionRef(1)
    )
    task = Task(
        workflow=WORKFLOWS.get("agentscope_react_math_workflow"),
        repeat_times=2,
        raw_task={"question": "3+4=", "answer": "7"},
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        task_id="m0",
    )
    try:
        results = await runner.run_tasks([task])
    finally:
        runner.close()
    for result in results:
        assert not result.skipped, result.errors
        exps = result.experiences
        assert len(exps) == REACT_MAX_ITERS + 1
        system = exps[0].messages[0]
        assert content_text(system.content) == MATH_REACT_SYSTEM_PROMPT
        assert all(e.reward == 0.0 and e.metrics["accuracy"] == 0.0 for e in exps)


async def adapter_agent(task: dict[str, Any], model: Any, auxiliary_models: dict[str, Any]) -> dict[str, Any]:
    """A tuner workflow function: two calls of the agentscope chat model; the replies go to the judge."""
    from agentscope.formatter import OpenAIChatFormatter
    from agentscope.message import Msg

    formatter = OpenAIChatFormatter()
    replies = []
    for question in (task["question"], task["question"] + "0"):
        res = await model(await formatter.format([Msg("user", question, "user")]))
        replies.append("".join(block.get("text", "") for block in res.content))
    return {"response": replies, "metrics": {"calls": 2.0}}


JUDGED: list[Any] = []


async def adapter_judge(
    task: dict[str, Any], response: Any, auxiliary_models: dict[str, Any]
) -> dict[str, Any]:
    JUDGED.append(response)
    return {"reward": task["weight"] * len(response), "metrics": {"judged": 1.0}}


async def test_adapter_v1_turns_agentscope_model_calls_into_experiences(engine_and_tokenizer) -> None:
    engine, tok = engine_and_tokenizer
    wrapper = wrapper_factory(engine, tok)(0)
    task = Task(
        workflow=WORKFLOWS.get("agentscope_workflow_adapter_v1"),
        raw_task={"question": "7+5=", "weight": 0.25},
        workflow_args={
            "workflow_func": f"{__name__}:adapter_agent",
            "judge_func": f"{__name__}:adapter_judge",
        },
    )
    JUDGED.clear()
    try:
        exps = await task.to_workflow(wrapper).run_async()
    finally:
        wrapper.close()
    assert [content_text(e.messages[0].content) for e in exps] == ["7+5=", "7+5=0"]
    assert JUDGED == [[e.response_text for e in exps]]
    assert [e.reward for e in exps] == [0.5, 0.5]  # 0.25 x two replies
    assert exps[0].metrics == {} and exps[1].metrics == {"calls": 2.0, "judged": 1.0}


async def test_text_parts_reach_the_chat_template_as_text(engine_and_tokenizer) -> None:
    engine, tok = engine_and_tokenizer
    wrapper = wrapper_factory(engine, tok)(0)
    try:
        client = wrapper.get_openai_async_client()
        await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": [{"type": "text", "text": "12+30="}]}],
            max_tokens=2,
        )
        [exp] = wrapper.extract_experience_from_history()
    finally:
        wrapper.close()
    assert exp.prompt_text == "12+30="  # the builtin chat template concatenates the contents
