"""The general multi-step workflows (Trinity's step_wise_workflow.py) on the real tiny model over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.step_wise import AsyncStepWiseRewardWorkflow, ChatEnvWorkflow


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[Any, Any]]:
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer("builtin:tiny-arith")
    eng = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"), eos_token_ids=[tok.eos_token_id], pad_token_id=0
        )
    )
    yield eng, tok


def wrapper(engine: tuple[Any, Any], history: bool = True) -> Any:
    from services.explorer.model_wrapper import ModelWrapper

    return ModelWrapper(engine[0], engine[1], max_response_tokens=4, enable_history=history)


def game(target: int, **workflow_args: Any) -> Task:
    return Task(
        workflow=WORKFLOWS.get("step_wise_chat_env_workflow"),
        raw_task={"low": 0, "high": 9, "target": target},
        workflow_args={"max_turns": 3, "stop_on_truncation": False, **workflow_args},
        format_args=FormatConfig(system_prompt="Guess."),
        task_id=str(target),
    )


async def test_chat_env_runs_are_several_calls_with_the_runs_return(engine: tuple[Any, Any]) -> None:
    engine[0].engine.model_version = 2  # holds version 2, as after the explorer loaded it
    runner = WorkflowRunner(
        lambda i: wrapper(engine), slots=2, max_timeout=60, max_retry_times=0, version_fn=VersionRef(2)
    )
    try:
        task = game(4)
        task.repeat_times = 2
        results = await runner.run_tasks([task])  # one unit per run
    finally:
        runner.close()
    exps = [e for r in results for e in r.experiences]
    by_run: dict[int, list[Experience]] = {}
    for exp in exps:
        by_run.setdefault(exp.run_id, []).append(exp)
    assert sorted(by_run) == [0, 1]
    for steps in by_run.values():
        # one experience per turn, numbered 0.., each the full conversation so far as its prompt
        assert [e.step for e in steps] == list(range(len(steps))) and 1 <= len(steps) <= 3
        assert len({e.reward for e in steps}) == 1
        assert all(e.metrics["actual_env_steps"] == len(steps) for e in steps)
        assert all(e.model_version == 2 for e in steps)
        prompts = [e.prompt_length for e in steps]
        assert prompts == sorted(prompts) and (len(prompts) == 1 or prompts[0] < prompts[-1])
        assert steps[-1].messages[1].content.startswith("Guess a number between 0 and 9")
        # gigpo's info: the turns' rewards add up to the run's return; distinct histories, distinct states
        assert sum(e.info["step_reward"] for e in steps) == pytest.approx(steps[0].reward)
        assert len({e.info["env_state_hash"] for e in steps}) == len(steps)
    # both runs' first calls answered the same conversation: one anchor state
    assert by_run[0][0].info["env_state_hash"] == by_run[1][0].info["env_state_hash"]


async def test_truncated_reply_ends_the_run_by_default(engine: tuple[Any, Any]) -> None:
    model = wrapper(engine)
    try:
        # max_response_tokens 4: an untrained model always hits the limit, so one call per run
        exps = ChatEnvWorkflow(task=game(4, stop_on_truncation=True), model=model).run()
    finally:
        model.close()
    assert len(exps) == 1 and exps[0].info["finish_reason"] == "length" and exps[0].step == 0


class CountingSteps(AsyncStepWiseRewardWorkflow):
    """Two calls per step, a reward per step equal to its number; stops after step 1."""

    max_step_num = 5

    async def step_async(self, step_num: int) -> bool:
        for _ in range(2):
            self.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"{step_num}+1="}]
            )
        return step_num < 1

    async def reward_async(self, exps: list[Experience], step_num: int) -> float:
        return float(step_num)


async def test_step_wise_reward_workflow_scores_each_steps_calls(engine: tuple[Any, Any]) -> None:
    model = wrapper(engine)
    try:
        flow = CountingSteps(task=game(1), model=model)
        flow.stop_on_truncation = False
        exps = await flow.run_async()
    finally:
        model.close()
    assert [(e.step, e.reward) for e in exps] == [(0, 0.0), (0, 0.0), (1, 1.0), (1, 1.0)]


def test_history_off_is_refused_naming_the_key(engine: tuple[Any, Any]) -> None:
    with pytest.raises(InvalidArgument) as err:
        ChatEnvWorkflow(task=game(1), model=wrapper(engine, history=False))
    assert err.value.field == "explorer.rollout_model.enable_history"
