"""gigpo's explorer-side operator: step rewards and anchor keys read from each row's info.

Numbers are worked by hand in the comments.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from services.common.config.algorithm import AlgorithmConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.pipeline.gigpo import GiGPO
from services.explorer.pipeline.step_wise import explorer_side_advantage


def row(
    run: int, step: int, reward: float, info: dict[str, Any], mask: tuple[bool, ...] = (True, True)
) -> Experience:
    return Experience(
        tokens=np.arange(1, 2 + len(mask), dtype=np.int64),
        prompt_length=1,
        model_version=0,
        reward=reward,
        action_mask=np.array(mask),
        group_id="A",
        run_id=run,
        step=step,
        info=info,
    )


def two_runs(dense: bool) -> list[Experience]:
    # run 0 finishes at its second step (every row carries the run's reward 1, as
    # RewardPropagationWorkflow gives it); run 1 never finishes (-0.1). Both first steps saw "h0".
    def info(key: str, step_reward: float) -> dict[str, Any]:
        return {"env_state_hash": key, "step_reward": step_reward} if dense else {"env_state_hash": key}

    return [
        row(0, 0, 1.0, info("h0", 0.0)),
        row(1, 0, -0.1, info("h0", 0.0)),
        row(0, 1, 1.0, info("h1", 1.0), (True, False)),
        row(1, 1, -0.1, info("h2", 0.0)),
    ]


def test_step_rewards_from_info() -> None:
    # step rewards run 0 [0, 1], run 1 [0, 0]: episode sums 1, 0 -> A_E +0.5 / -0.5.
    # Returns (gamma 1): run 0 [1, 1], run 1 [0, 0]. Anchor h0: [1, 0] -> +0.5 / -0.5; h1, h2 alone.
    # A: run 0 step 0 = 1.0, step 1 = 0.5 (its mask hides the second token); run 1: -1.0, -0.5.
    exps, metrics = GiGPO(epsilon=0.0).process(two_runs(dense=True))
    assert np.allclose(
        np.stack([e.advantages for e in exps]), [[1.0, 1.0], [-1.0, -1.0], [0.5, 0.0], [-0.5, -0.5]]
    )
    assert all(np.array_equal(e.returns, e.advantages) for e in exps)
    assert metrics["runs"] == 2 and metrics["anchor_groups_size_gt1"] == 1


def test_without_step_rewards_only_the_last_rows_reward_counts() -> None:
    # sparse: run 0 [0, 1], run 1 [0, -0.1]: sums 1, -0.1, mean 0.45 -> A_E +0.55 / -0.55.
    # Returns run 0 [1, 1], run 1 [-0.1, -0.1]; anchor h0: [1, -0.1] -> +0.55 / -0.55.
    # A: run 0: 1.1, 0.55; run 1: -1.1, -0.55.
    exps, _ = GiGPO(epsilon=0.0).process(two_runs(dense=False))
    assert [float(e.advantages[0]) for e in exps] == pytest.approx([1.1, -1.1, 0.55, -0.55])


def test_eval_rows_pass_through_untouched() -> None:
    exps = two_runs(dense=True)
    exps[3].is_eval = True
    out, _ = GiGPO().process(exps)
    assert len(out) == 4 and out[3].advantages is None


def test_explorer_runs_gigpo_from_the_preset_and_refuses_a_bad_fnorm() -> None:
    algorithm = AlgorithmConfig(algorithm_type="gigpo")
    assert algorithm.advantage_fn == "gigpo" and algorithm.repeat_times == 8
    assert algorithm.advantage_fn_args == {"omega": 1.0, "gamma": 1.0, "fnorm": "none", "epsilon": 1e-6}
    assert algorithm.policy_loss_fn_args == {
        "clip_range_low": 0.2,
        "clip_range_high": 0.2,
        "loss_agg_mode": "token-mean",
    }
    name, op = explorer_side_advantage(SimpleNamespace(algorithm=algorithm))  # type: ignore[misc, arg-type]
    assert name == "gigpo" and isinstance(op, GiGPO) and op.group_local is False
    with pytest.raises(InvalidArgument, match="fnorm"):
        GiGPO(fnorm="mad")
