"""The cod advantage's maths (services/algorithms/advantage/cod.py), against numbers worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from services.algorithms.advantage import ADVANTAGE_FN
from services.algorithms.advantage.cod import CodArgs, CodRow, adaptive_temperature, cod_causal_scores
from services.common.errors import InvalidArgument


def pack_run(run: int, task_rewards: list[float], hint_rewards: list[float], task: str = "P") -> list[CodRow]:
    """solve 0, hint 0, solve 1, hint 1, ..., solve n-1: a CoD run's episodes, 1 response token each."""
    rows = []
    for i, _ in enumerate(task_rewards):
        rows.append(CodRow(task, run, "solve_task", i, task_rewards[i], tuple(task_rewards), 1))
        if i < len(hint_rewards):
            rows.append(CodRow(task, run, "gen_hint", i, hint_rewards[i], tuple(task_rewards), 1))
    return rows


def test_mean_reward_to_go_against_the_group_mean_of_each_episode() -> None:
    # run 0: r = [0, 1, 1], hint rewards [-0.1, 0]; run 1: r = [1, 1, 1], hints [0, 0]
    # run 0 returns: solve0 mean[0,1,1] = 2/3, hint0 mean[-0.1,1,1] = 0.6333, solve1 1, hint1 mean[0,1] = 0.5, solve2 1
    # run 1 returns: solve0 1, hint0 mean[0,1,1] = 2/3, solve1 1, hint1 0.5, solve2 1
    # baselines: solve0 5/6, hint0 0.65; the rest equal across runs -> scores 0
    rows = pack_run(0, [0, 1, 1], [-0.1, 0]) + pack_run(1, [1, 1, 1], [0, 0])
    scores, returns, metrics = cod_causal_scores(rows, CodArgs())
    assert returns[:5] == pytest.approx([2 / 3, 1.9 / 3, 1.0, 0.5, 1.0])
    assert scores == pytest.approx([-1 / 6, -1 / 60, 0, 0, 0, 1 / 6, 1 / 60, 0, 0, 0])
    assert metrics["active_weight_temp_mean"] == 0.0 and metrics["experience_count"] == 10


def test_discounted_and_windowed_returns() -> None:
    rows = pack_run(0, [0, 1, 1], [-0.1, 0])
    # discounted, gamma 0.5: solve0 0 + 0.5*1 + 0.25*1 = 0.75; hint0 -0.1 + 0.5 + 0.25 = 0.65;
    # solve1 1 + 0.5 = 1.5; hint1 0 + 0.5 = 0.5; solve2 1
    _, returns, _ = cod_causal_scores(
        rows, CodArgs(e2e_causal_returns_style="discounted", e2e_causal_returns_gamma=0.5)
    )
    assert returns == pytest.approx([0.75, 0.65, 1.5, 0.5, 1.0])
    # window 1: each episode's own reward only
    _, returns, _ = cod_causal_scores(
        rows, CodArgs(e2e_causal_returns_style="sliding_window_mean", e2e_causal_returns_window=1)
    )
    assert returns == pytest.approx([0.0, -0.1, 1.0, 0.0, 1.0])


def test_a_fixed_temperature_reweights_each_score() -> None:
    rows = pack_run(0, [0, 1], [0]) + pack_run(1, [1, 1], [0])
    # solve0: returns 0.5 vs 1 -> scores -0.25, +0.25; hint0: 0.5 vs 0.5 -> 0; solve1: 0
    scores, _, metrics = cod_causal_scores(rows, CodArgs(red_weight_temp=0.5))
    assert scores[0] == pytest.approx(-0.25 * math.exp(-0.5))  # s * exp(s / T)
    assert scores[3] == pytest.approx(0.25 * math.exp(0.5))
    assert scores[1] == 0.0 and metrics["active_weight_temp_mean"] == 0.5


def test_adaptive_temperature_brings_the_token_weighted_advantage_to_zero() -> None:
    # scores [1, -1], lengths [1, 3]: sum = 1 - 3 < 0. f(T) = e^(1/T) - 3 e^(-1/T) = 0 at
    # e^(2/T) = 3, T = 2 / ln 3 = 1.8205; bisection stops within 0.05 of it
    temp = adaptive_temperature([1.0, -1.0], [1, 3])
    assert temp is not None and temp == pytest.approx(2 / math.log(3), abs=0.05)
    assert adaptive_temperature([1.0, -1.0], [3, 1]) is None  # already non-negative: no re-weighting
    # the temperature stays in [0.8, 100]: all-negative scores drive it to the floor
    floor = adaptive_temperature([-1.0], [1])
    assert floor is not None and 0.8 <= floor < 0.85


def test_adaptive_temperature_in_the_scores() -> None:
    # run 0 fails the only task of a pack of one (r = [0]), run 1 solves it (r = [1]); run 0 replied
    # 3 tokens, run 1 one: scores -0.5 (3 tokens), +0.5 (1 token); sum -1 < 0, so T solves
    # 0.5 e^(0.5/T) = 1.5 e^(-0.5/T): T = 1 / ln 3 = 0.910
    rows = [CodRow("P", 0, "solve_task", 0, 0.0, (0.0,), 3), CodRow("P", 1, "solve_task", 0, 1.0, (1.0,), 1)]
    scores, _, metrics = cod_causal_scores(
        rows, CodArgs(red_weight_adaptive_temp=True, red_weight_adaptive_version="bisection")
    )
    temp = metrics["active_weight_temp_mean"]
    assert temp == pytest.approx(1 / math.log(3), abs=0.05)
    assert scores == pytest.approx([-0.5 * math.exp(-0.5 / temp), 0.5 * math.exp(0.5 / temp)])


def test_the_shift_only_lifts_a_negative_token_mean() -> None:
    rows = [CodRow("P", 0, "solve_task", 0, 0.0, (0.0,), 3), CodRow("P", 1, "solve_task", 0, 1.0, (1.0,), 1)]
    # token mean of [-0.5 x3, 0.5 x1] = -1/4 -> every score + 1/4
    scores, _, _ = cod_causal_scores(rows, CodArgs(red_weight_adv_shift=True))
    assert scores == pytest.approx([-0.25, 0.75])
    rows = [CodRow("P", 0, "solve_task", 0, 0.0, (0.0,), 1), CodRow("P", 1, "solve_task", 0, 1.0, (1.0,), 3)]
    scores, _, _ = cod_causal_scores(rows, CodArgs(red_weight_adv_shift=True))
    assert scores == pytest.approx([-0.5, 0.5])  # +1/4: no shift


def test_per_task_temperature_levels() -> None:
    # two pack tasks, each [-0.5 x3 tokens, +0.5 x1]: the same T in each; with level "task" two temperatures
    rows = []
    for task in ("P", "Q"):
        rows += [
            CodRow(task, 0, "solve_task", 0, 0.0, (0.0,), 3),
            CodRow(task, 1, "solve_task", 0, 1.0, (1.0,), 1),
        ]
    args = CodArgs(
        red_weight_adaptive_temp=True,
        red_weight_adaptive_version="bisection",
        red_weight_adaptive_level="task",
    )
    scores, _, metrics = cod_causal_scores(rows, args)
    assert scores[:2] == pytest.approx(scores[2:])
    assert metrics["active_weight_temp_mean"] == pytest.approx(1 / math.log(3), abs=0.05)


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ({"e2e_causal_returns_style": "median"}, "e2e_causal_returns_style"),
        ({"e2e_causal_returns_style": "sliding_window_mean"}, "e2e_causal_returns_window"),
        ({"e2e_causal_returns_gamma": 1.5}, "e2e_causal_returns_gamma"),
        ({"e2e_causal_baseline": "min"}, "e2e_causal_baseline"),
        ({"red_weight_temp": 0.0}, "red_weight_temp"),
        ({"red_weight_adaptive_temp": True}, "red_weight_adaptive_version"),
        ({"red_weight_adaptive_level": "batch"}, "red_weight_adaptive_level"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(args: dict[str, object], key: str) -> None:
    with pytest.raises(InvalidArgument, match=f"advantage_fn_args.{key}"):
        CodArgs(**args)  # type: ignore[arg-type]


def test_the_trainer_side_refuses_rows_without_advantages_and_checks_names() -> None:
    fn = ADVANTAGE_FN.get("cod")
    with pytest.raises(InvalidArgument, match="computed by the explorer"):
        fn(
            torch.zeros(1),
            iterative_hint_e2e_causal=True,
            red_weight_adaptive_temp=True,
            red_weight_adaptive_version="bisection",
        )
    with pytest.raises(InvalidArgument, match="red_weight_adaptive_version"):
        fn(torch.zeros(1), red_weight_adaptive_temp=True)
