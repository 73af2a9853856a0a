"""cod_optimalcontrol_workflow: the hidden dynamics and loss worked by hand, the answer format, and
episodes on scripted replies (a pack run passing the last working controller on)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.common.config.cod import CodConfig
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.cod.hints import HINT_END, HINT_START
from services.explorer.workflows.cod.optimal_control import (
    PARSE_FAILURE_REWARD,
    CodOptimalControlWorkflow,
    ControlTask,
    parse_submission,
    sample_b,
)
from services.explorer.workflows.cod.pack import pack_tasks

ARGS = {"a_env_range": [0.55, 1.2], "b_env_range": [-1.5, 1.5], "min_abs_b_env": 0.35}
ROW = {"x0": 0.0, "v0": 0.0, "x_target": 1.0, "v_target": 0.0, "horizon": 2, "control_penalty_coef": 0.1}


def test_rollout_loss_and_reward_by_hand() -> None:
    # a 1, b 0.5, u = 1: t0 v 0.5 x 0.5; t1 v 1.0 x 1.5; loss 0.5^2 + 2 * 1^2 + 0.1 * 2 = 2.45
    task = ControlTask(1.0, 0.5, 0.0, 0.0, 1.0, 0.0, 2, 0.1, 0.0, 0)
    result = task.rollout(lambda x, v, t, xt, vt: 3.0)  # clipped to 1
    assert result["xs"] == [0.0, 0.5, 1.5] and result["us"] == [1.0, 1.0]
    assert result["loss"] == pytest.approx(2.45) and result["reward"] == pytest.approx(1 / 3.45)
    with pytest.raises(RuntimeError, match="action failed at t=0"):
        task.rollout(lambda x, v, t, xt, vt: float("nan"))


def test_the_hidden_system_comes_from_the_pack_seed() -> None:
    one = ControlTask.resolve({**ROW, "seed": 1, "pack_seed": 9}, ARGS)
    two = ControlTask.resolve({**ROW, "seed": 2, "pack_seed": 9}, ARGS)
    assert (one.a, one.b) == (two.a, two.b) and 0.55 <= one.a <= 1.2 and 0.35 <= abs(one.b) <= 1.5
    rng = random.Random(9)
    assert one.a == rng.uniform(0.55, 1.2)


def test_b_avoids_the_band_around_zero() -> None:
    rng = random.Random(0)
    draws = [sample_b(rng, -1.5, 1.5, 0.35) for _ in range(200)]
    assert all(0.35 <= abs(b) <= 1.5 for b in draws) and min(draws) < 0 < max(draws)
    assert sample_b(random.Random(0), -0.2, 0.35, 0.35) == 0.35  # only the edge is left


def test_parse_submission() -> None:
    ok = "think <answer><action_expression> 0.5 * (x_target - x) </action_expression></answer>"
    assert parse_submission(ok) == ("0.5 * (x_target - x)", "")
    assert parse_submission(ok + " bye")[1] == "answer_must_end_the_response"
    assert parse_submission("```x```" + ok)[1] == "python_or_markdown_code_is_not_allowed"
    assert parse_submission("<answer><u>1</u></answer>")[1] == "expected_action_expression"
    assert (
        parse_submission("<answer><action_expression>y</action_expression></answer>")[1]
        == "unknown variable: y"
    )
    assert parse_submission("<answer><action_expression>x &lt; 1</action_expression></answer>")[0] == "x < 1"


def task(seed: int, **args: Any) -> Task:
    return Task(
        workflow=CodOptimalControlWorkflow,
        workflow_args={**ARGS, **args},
        raw_task={**ROW, "seed": seed},
        task_id=str(seed),
        index=seed,
        taskset="control",
    )


def answer(expression: str) -> str:
    return f"<answer><action_expression>{expression}</action_expression></answer>"


async def test_episodes_score_the_submitted_controller(make_model: Any) -> None:
    model, _ = make_model([answer("1"), "no answer", answer("1 / (x - x)")])
    exps = await CodOptimalControlWorkflow(task=task(3), model=model).run_async()
    expected = ControlTask.resolve({**ROW, "seed": 3}, ARGS).rollout(lambda *a: 1.0)["reward"]
    assert len(exps) == 1 and exps[0].reward == pytest.approx(expected)
    assert "The system ran the submitted controller" in exps[0].info["feedback"]
    assert "Submitted action expression" in exps[0].info["trajectory"]
    exps = await CodOptimalControlWorkflow(task=task(3), model=model).run_async()
    assert exps[0].reward == PARSE_FAILURE_REWARD and exps[0].metrics["format_error_termination"] == 1.0
    exps = await CodOptimalControlWorkflow(task=task(3), model=model).run_async()
    assert exps[0].reward == 0.0 and "ZeroDivisionError" in exps[0].info["feedback"]


async def test_a_pack_run_passes_the_last_working_controller_on(make_model: Any) -> None:
    tasks = [task(s, include_previous_control_policy=True) for s in (1, 2)]
    for t in tasks:
        t.workflow = WORKFLOWS.get("cod_optimalcontrol_workflow")
    (pack,) = pack_tasks(tasks, CodConfig(task_pack_size=2, cod_workflow_args={"inject_pack_seed": True}))
    model, _ = make_model([answer("0.3"), f"{HINT_START}\n- b > 0?\n{HINT_END}", answer("0.2")])
    exps = await pack.workflow(task=pack, model=model).run_async()
    first, second = exps[0].info["user_prompt"], exps[2].info["user_prompt"]
    assert "earlier task" not in first
    assert (
        "<action_expression>0.3</action_expression>" in second
        and f"got reward {exps[0].reward:.3f}" in second
    )
