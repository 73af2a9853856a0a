"""gigpo_scores against numbers worked by hand (services/algorithms/advantage/gigpo.py)."""

from __future__ import annotations

import pytest
import torch

from services.algorithms.advantage import ADVANTAGE_FN
from services.algorithms.advantage.gigpo import discounted_returns, gigpo_scores
from services.common.errors import InvalidArgument


def test_discounted_returns_run_from_the_last_step_back() -> None:
    # rewards [1, 0, 2], gamma 0.5: R_2 = 2, R_1 = 0 + 0.5 * 2 = 1, R_0 = 1 + 0.5 * 1 = 1.5
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == [1.5, 1.0, 2.0]


def test_two_runs_of_one_task_episode_plus_anchor_advantages() -> None:
    # run 0: steps "start" (r 0), "room" (r 1); run 1: "start", "room", "hall", all r 0. gamma 0.5.
    # Episode returns (undiscounted sums) 1 and 0: mean 0.5, fnorm none -> A_E = +0.5 / -0.5.
    # Discounted returns: run 0 [0 + 0.5 * 1, 1] = [0.5, 1]; run 1 [0, 0, 0].
    # Anchor "start": [0.5, 0] -> mean 0.25 -> A_S +0.25 / -0.25; "room": [1, 0] -> +0.5 / -0.5;
    # "hall" is alone -> 0. A = A_E + A_S:
    #   run 0: 0.5 + 0.25 = 0.75, 0.5 + 0.5 = 1.0; run 1: -0.75, -1.0, -0.5 + 0 = -0.5.
    # Rows are given out of step order (run 0's second step first) to check the sorting.
    scores, metrics = gigpo_scores(
        [1.0, 0.0, 0.0, 0.0, 0.0],
        task_index=[0, 0, 0, 0, 0],
        run_index=[0, 0, 1, 1, 1],
        step_order=[1, 0, 0, 1, 2],
        anchor_keys=["room", "start", "start", "room", "hall"],
        gamma=0.5,
        epsilon=0.0,
    )
    assert scores.tolist() == pytest.approx([1.0, 0.75, -0.75, -1.0, -0.5])
    assert metrics["anchor_groups_total"] == 3 and metrics["anchor_groups_size_gt1"] == 2
    assert metrics["anchor_group_hit_ratio"] == pytest.approx(2 / 3)
    # |A_E| is 0.5 on every row; |A_S| = (0.5 + 0.25 + 0.25 + 0.5 + 0) / 5 = 0.3
    assert metrics["mean_abs_A_E"] == pytest.approx(0.5)
    assert metrics["mean_abs_A_S"] == pytest.approx(0.3)


def test_fnorm_std_divides_by_the_unbiased_std_and_omega_weights_the_step_level() -> None:
    # three one-step runs of one task, returns 3, 1, 2, all under anchor "s": mean 2,
    # unbiased std sqrt((1 + 1 + 0) / 2) = 1 -> A_E = A_S = [1, -1, 0] / (1 + 1e-6);
    # omega 0.5: A = 1.5 * [1, -1, 0] / (1 + 1e-6)
    scores, _ = gigpo_scores(
        [3.0, 1.0, 2.0], [0, 0, 0], [0, 1, 2], [0, 0, 0], ["s", "s", "s"], omega=0.5, fnorm="std"
    )
    assert scores.tolist() == pytest.approx([1.5 / (1 + 1e-6), -1.5 / (1 + 1e-6), 0.0])


def test_a_task_with_one_run_keeps_its_raw_return_and_anchors_cross_tasks() -> None:
    # task 0 and task 1 have one one-step run each (returns 1 and 0): a group of one has mean 0 and
    # denominator 1, so A_E = 1 / (1 + 1e-6) and 0. Both steps saw state "k" (Trinity groups anchors
    # over the whole batch): A_S = [1, 0] - 0.5 = +0.5 / -0.5 (each / (1 + 1e-6)).
    scores, _ = gigpo_scores([1.0, 0.0], [0, 1], [0, 1], [0, 0], ["k", "k"])
    assert scores.tolist() == pytest.approx([1.5 / (1 + 1e-6), -0.5 / (1 + 1e-6)])


def test_rows_without_an_anchor_key_get_the_episode_advantage_only() -> None:
    # returns 2 and 0: A_E = +1 / -1; no keys, so A_S = 0
    scores, metrics = gigpo_scores([2.0, 0.0], [0, 0], [0, 1], [0, 0], [None, None], epsilon=0.0)
    assert scores.tolist() == pytest.approx([1.0, -1.0])
    assert metrics["anchor_group_hit_ratio"] == 0.0


def test_unknown_fnorm_is_refused_with_its_field() -> None:
    with pytest.raises(InvalidArgument, match="fnorm must be one of std, none") as info:
        gigpo_scores([1.0], [0], [0], [0], [None], fnorm="batch")
    assert info.value.field == "algorithm.advantage_fn_args.fnorm"


def test_trainer_side_gigpo_refuses_rows_without_explorer_advantages() -> None:
    with pytest.raises(InvalidArgument, match="explorer's experience pipeline"):
        ADVANTAGE_FN.get("gigpo")(torch.zeros(1))
