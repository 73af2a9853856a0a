"""The cod advantage's explorer-side operator: episode info read from each row, advantages broadcast."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from services.common.config.algorithm import AlgorithmConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.pipeline.cod import CodAdvantage
from services.explorer.pipeline.step_wise import explorer_side_advantage


def row(
    run: int, kind: str, position: int, reward: float, task_rewards: list[float], **info: Any
) -> Experience:
    key = "task_idx" if kind == "solve_task" else "hint_idx"
    return Experience(
        tokens=np.arange(1, 4, dtype=np.int64),
        prompt_length=1,
        model_version=0,
        reward=reward,
        action_mask=np.array([True, False]),
        group_id="P",
        run_id=run,
        step=position,
        info={"exp_type": kind, key: position, "task_rewards": task_rewards, "taskset_id": 0, **info},
    )


def pack(run: int, rewards: list[float], hint: float, **info: Any) -> list[Experience]:
    return [
        row(run, "solve_task", 0, rewards[0], rewards, **info),
        row(run, "gen_hint", 0, hint, rewards, **info),
        row(run, "solve_task", 1, rewards[1], rewards, **info),
    ]


def test_the_config_puts_it_in_the_pipeline() -> None:
    algorithm = AlgorithmConfig(
        algorithm_type="multi_step_grpo",
        advantage_fn="cod",
        advantage_fn_args={"std_cal_level": "none", "iterative_hint_e2e_causal": True},
    )
    name, op = explorer_side_advantage(SimpleNamespace(algorithm=algorithm))  # type: ignore[misc, arg-type]
    assert name == "cod" and isinstance(op, CodAdvantage) and op.causal and not op.group_local


def test_causal_advantages_and_returns_on_the_response_tokens() -> None:
    # run 0: r = [0, 1], hint -0.1; run 1: r = [1, 1], hint 0
    # returns run 0: solve0 0.5, hint0 mean[-0.1, 1] = 0.45, solve1 1; run 1: 1, 0.5, 1
    # baselines 0.75, 0.475, 1 -> scores run 0: -0.25, -0.025, 0; run 1: +0.25, +0.025, 0
    exps = pack(0, [0, 1], -0.1) + pack(1, [1, 1], 0.0)
    out, metrics = CodAdvantage(iterative_hint_e2e_causal=True).process(exps)
    assert [e.advantages[0] for e in out] == pytest.approx([-0.25, -0.025, 0, 0.25, 0.025, 0])
    assert all(e.advantages[1] == 0 for e in out)  # masked token
    assert [e.returns[0] for e in out] == pytest.approx([0.5, 0.45, 1, 1, 0.5, 1])
    assert metrics["judge_format_error_count"] == 0


def test_runs_a_judge_flagged_are_dropped() -> None:
    exps = (
        pack(0, [0, 1], 0.0, judge_format_error_in_trajectory=True)
        + pack(1, [1, 1], 0.0)
        + pack(2, [0, 0], 0.0)
    )
    out, metrics = CodAdvantage(iterative_hint_e2e_causal=True).process(exps)
    assert len(out) == 6 and {e.run_id for e in out} == {1, 2}
    assert metrics["judge_format_error_count"] == 3
    assert out[0].advantages[0] == pytest.approx(0.5)  # solve0 returns 1 vs 0 -> mean 0.5


def test_without_the_causal_mode_it_is_step_wise_grpo_on_the_last_reward() -> None:
    # each run's last row carries its reward: run 0 1.0, run 1 0.0; std_cal_level none -> +-0.5 on every row
    exps = pack(0, [0, 1], 0.0) + pack(1, [0, 0], 0.0)
    out, _ = CodAdvantage(std_cal_level="none").process(exps)
    assert [e.advantages[0] for e in out] == pytest.approx([0.5] * 3 + [-0.5] * 3)


def test_rows_not_from_a_pack_are_refused_naming_what_is_missing() -> None:
    exp = row(0, "solve_task", 0, 1.0, [1.0])
    del exp.info["task_rewards"]
    with pytest.raises(InvalidArgument, match="cod: section"):
        CodAdvantage(iterative_hint_e2e_causal=True).process([exp])


def test_bad_arguments_fail_at_start_up() -> None:
    with pytest.raises(InvalidArgument, match="e2e_causal_returns_style"):
        CodAdvantage(e2e_causal_returns_style="median")
    with pytest.raises(InvalidArgument, match="made_up"):
        CodAdvantage(made_up=1)
