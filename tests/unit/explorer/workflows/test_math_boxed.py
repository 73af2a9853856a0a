"""math_boxed_workflow / async_math_boxed_workflow: prompts, workflow_args, rewards; one run on tiny-arith.

Rewards are worked out by hand from services/explorer/rewards/math.py's rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.common.config.buffer import FormatConfig
from services.common.experience import Experience
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.rewards.math import overlong_penalty
from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.base import RolloutArgs
from services.explorer.workflows.math_boxed import DEFAULT_SYSTEM_PROMPT, DEFAULT_SYSTEM_PROMPT_WITH_THINK


class CannedModel:
    """Answers every call with the canned replies; a reply of k characters is k tokens after a 3-token prompt."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.calls: list[tuple[str, Any]] = []

    def _exps(self) -> list[Experience]:
        return [
            Experience(tokens=np.arange(3 + len(r)), prompt_length=3, model_version=0, response_text=r)
            for r in self.replies
        ]

    def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> list[Experience]:
        self.calls.append(("chat", messages))
        return self._exps()

    def generate(self, prompts: list[str], **kwargs: Any) -> list[Experience]:
        self.calls.append(("generate", prompts))
        return self._exps()


def make_task(name: str = "math_boxed_workflow", **changes: Any) -> Task:
    task = Task(
        workflow=WORKFLOWS.get(name),
        raw_task={"prompt": "What is 1/4 + 1/4?", "answer": "0.5"},
        format_args=FormatConfig(prompt_key="prompt", response_key="answer"),
        rollout_args=RolloutArgs(n=3, temperature=1.0),
    )
    for key, value in changes.items():
        setattr(task, key, value)
    return task


def test_with_think_scores_answer_and_think_block() -> None:
    replies = [
        "<think>\n1/4+1/4=1/2\n</think>\n\\boxed{\\frac{1}{2}}",  # right, one think block: 1 + 0 = 1
        "\\boxed{0.5}",  # right, no think block: 1 - 0.2 = 0.8
        "0.5",  # no box: 0 - 0.2 = -0.2
    ]
    model = CannedModel(replies)
    task = make_task(workflow_args={"with_think": True, "format_score_coef": 0.2})
    exps = task.to_workflow(model).run()
    assert model.calls == [
        (
            "chat",
            [
                {"role": "system", "content": DEFAULT_SYSTEM_PROMPT_WITH_THINK},
                {"role": "user", "content": "What is 1/4 + 1/4?"},
            ],
        )
    ]
    assert [e.reward for e in exps] == pytest.approx([1.0, 0.8, -0.2])
    assert exps[1].metrics == {"accuracy": 1.0, "format_score": pytest.approx(-0.2)}
    assert exps[0].info["truth"] == "0.5"


def test_use_base_prompt_and_defaults() -> None:
    model = CannedModel(["\\boxed{1/2}"])
    exps = make_task(workflow_args={"use_base": True}).to_workflow(model).run()
    # default system prompt (no think), Trinity's plain-text layout; with_think off: no format part
    assert model.calls == [
        ("generate", [f"System:{DEFAULT_SYSTEM_PROMPT}\nUser:\nWhat is 1/4 + 1/4?\nAssistant:\n"])
    ]
    assert exps[0].reward == 1.0 and exps[0].metrics == {"accuracy": 1.0, "format_score": 0.0}
    no_system = make_task(
        workflow_args={"use_base": True},
        format_args=FormatConfig(prompt_key="prompt", response_key="answer", system_prompt=""),
    )
    model = CannedModel(["x"])
    no_system.to_workflow(model).run()
    assert model.calls == [("generate", ["User:\nWhat is 1/4 + 1/4?\nAssistant:\n"])]


def test_dapo_reward_gets_the_reply_tokens() -> None:
    # L_max 10, L_cache 4: penalty starts after 6 tokens; "\boxed{0.5}" is 11 tokens > 10: -1
    # "\boxed{1}" is 9 tokens: (6 - 9) / 4 = -0.75, and 1 is wrong: -1 - 0.75 = -1.75
    model = CannedModel(["\\boxed{0.5}", "\\boxed{1}"])
    task = make_task(
        reward_fn=REWARD_FUNCTIONS.get("math_dapo_reward"),
        reward_fn_args={
            "enable_overlong_penalty": True,
            "penalty_factor": 1.0,
            "max_response_length": 10,
            "cache_length": 4,
        },
    )
    exps = task.to_workflow(model).run()
    assert [e.metrics for e in exps] == [
        {"accuracy": 1.0, "format_score": -1.0},
        {"accuracy": -1.0, "format_score": -0.75},
    ]
    assert [e.reward for e in exps] == [0.0, -1.75]


async def test_async_math_boxed_workflow_on_tiny_arith() -> None:
    """End to end: the runner drives the async workflow on the builtin model; every sample is scored."""
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"), eos_token_ids=[tok.eos_token_id], pad_token_id=0
        )
    )
    engine.engine.model_version = 3  # holds version 3, as after the explorer loaded it
    dapo = {
        "enable_overlong_penalty": True,
        "penalty_factor": 1.0,
        "max_response_length": 6,
        "cache_length": 4,
    }
    try:
        runner = WorkflowRunner(
            lambda i: ModelWrapper(engine, tok, max_response_tokens=8),
            slots=2,
            max_timeout=60,
            max_retry_times=0,
            version_fn=VersionRef(3),
        )
        tasks = [
            make_task(
                "async_math_boxed_workflow",
                raw_task={"prompt": f"{i}+1=", "answer": str(i + 1)},
                task_id=str(i),
                repeat_times=2,
                workflow_args={"use_base": True},
                format_args=FormatConfig(prompt_key="prompt", response_key="answer", system_prompt=""),
                reward_fn=REWARD_FUNCTIONS.get("math_dapo_reward"),
                reward_fn_args=dapo,
            )
            for i in range(2)
        ]
        assert tasks[0].workflow is not None and tasks[0].workflow.is_async
        results = await runner.run_tasks(tasks)
        exps = [e for r in results for e in r.experiences]
        assert len(exps) == 4 and not any(r.skipped for r in results)
        for e in exps:
            prompt = tok.decode(e.tokens[: e.prompt_length].tolist())
            assert prompt == f"User:\n{e.task_id}+1=\nAssistant:\n" and e.info["truth"] == str(
                int(e.task_id) + 1
            )
            assert e.model_version == 3 and e.metrics["accuracy"] in (1.0, -1.0)
            length = len(e.tokens) - e.prompt_length
            expected = overlong_penalty(length, max_response_length=6, cache_length=4, penalty_factor=1.0)
            assert e.metrics["format_score"] == pytest.approx(expected)
            assert e.reward == pytest.approx(e.metrics["accuracy"] + e.metrics["format_score"])
    finally:
        engine.close()
