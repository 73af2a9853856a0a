"""CoD (Connect the Dots; Chen et al. 2026) advantages: reward-to-go credit over a pack's episodes.

A CoD run (one rollout of a pack of n tasks) is a sequence of episodes: solve task 0, update the
hints (hint 0), solve task 1, hint 1, ..., solve task n-1. With r_0..r_{n-1} the task rewards of
the run and h_j the reward of hint update j (a length / parse penalty), each episode's rewards to go:

    solve task i:   G = [r_i, r_{i+1}, ..., r_{n-1}]
    hint update j:  G = [h_j, r_{j+1}, ..., r_{n-1}]

    R = mean(G)                                   returns_style "mean"
      = mean(G[:window])                          "sliding_window_mean"
      = sum_k gamma^k G[k]                         "discounted"
    b = mean of R over the runs of the pack task, per episode (kind, position): "group-mean"
    s = R - b

Re-weighting (the "red" weights), over all rows (or per task / per taskset, red_weight_adaptive_level)
with L the rows' response lengths in tokens:

    s' = s * exp(s / T)                           T: red_weight_temp, or adaptive (below); none: s' = s
    adaptive ("bisection"): only when sum(s * L) < 0, T in [0.8, 100] is bisected (20 halvings at
    most, stopping when the bracket is under 0.05) towards sum(s * exp(s/T) * L) = 0, so the
    token-weighted advantage stops being negative; T is the last midpoint tried
    red_weight_adv_shift: with m = sum(s * L) / sum(L) < 0, s' -= m (m from the unweighted s)

Advantage = s' on every response token, returns = R on every response token. Rows whose run was
flagged by a judge (judge_format_error / judge_format_error_in_trajectory) are dropped.

Trinity-RFT's CoDAdvantageFn (trinity/algorithm/advantage_fn/cod_advantage.py), its names and
defaults; iterative_hint_e2e_causal false is step-wise GRPO on each run's last reward
(services/algorithms/advantage/step_wise.py). It runs in the explorer's pipeline
(services/explorer/pipeline/cod.py): the rows' info (episode kind, position, the run's task
rewards) stays there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from services.algorithms.advantage.base import AdvantageOutput
from services.algorithms.advantage.step_wise import check_std_cal_level
from services.algorithms.batch import TrainBatch
from services.common.errors import InvalidArgument

RETURNS_STYLES = ("mean", "sliding_window_mean", "discounted")
BASELINES = ("group-mean",)
ADAPTIVE_LEVELS = (None, "task", "taskset")
FIELD = "algorithm.advantage_fn_args"


@dataclass(frozen=True)
class CodArgs:
    """The causal mode's settings (Trinity's advantage_fn_args names)."""

    e2e_causal_returns_style: str = "mean"
    e2e_causal_returns_window: int = -1
    e2e_causal_returns_gamma: float = 1.0
    e2e_causal_baseline: str = "group-mean"
    red_weight_temp: float | None = None
    red_weight_adaptive_temp: bool = False
    red_weight_adaptive_version: str | None = None
    red_weight_adaptive_level: str | None = None
    red_weight_adv_shift: bool = False

    def __post_init__(self) -> None:
        def refuse(key: str, why: str) -> None:
            raise InvalidArgument(f"{FIELD}.{key}: {why}", field=f"{FIELD}.{key}")

        if self.e2e_causal_returns_style not in RETURNS_STYLES:
            refuse(
                "e2e_causal_returns_style",
                f"one of {', '.join(RETURNS_STYLES)}, got {self.e2e_causal_returns_style!r}",
            )
        if self.e2e_causal_returns_style == "sliding_window_mean" and self.e2e_causal_returns_window < 1:
            refuse(
                "e2e_causal_returns_window",
                f"sliding_window_mean needs a window >= 1, got {self.e2e_causal_returns_window}",
            )
        if not 0.0 <= self.e2e_causal_returns_gamma <= 1.0:
            refuse("e2e_causal_returns_gamma", f"must be in [0, 1], got {self.e2e_causal_returns_gamma}")
        if self.e2e_causal_baseline not in BASELINES:
            refuse("e2e_causal_baseline", f"only 'group-mean', got {self.e2e_causal_baseline!r}")
        if self.red_weight_temp is not None and self.red_weight_temp <= 0:
            refuse("red_weight_temp", f"must be > 0, got {self.red_weight_temp}")
        if self.red_weight_adaptive_temp and self.red_weight_adaptive_version != "bisection":
            refuse(
                "red_weight_adaptive_version",
                f"'bisection' (the only one), got {self.red_weight_adaptive_version!r}",
            )
        if self.red_weight_adaptive_level not in ADAPTIVE_LEVELS:
            refuse(
                "red_weight_adaptive_level", f"task, taskset or unset, got {self.red_weight_adaptive_level!r}"
            )


@dataclass(frozen=True)
class CodRow:
    """One episode's row: what the CoD workflow put in its info, plus its run and length."""

    task: str  # the pack task (one explorer group)
    run: int
    kind: str  # "solve_task" or "gen_hint"
    position: int  # task_idx of a solve, hint_idx of a hint update
    reward: float  # the row's own reward (a hint update's penalty)
    task_rewards: tuple[float, ...]  # r_0..r_{n-1} of the row's run
    response_tokens: int  # L: response tokens (action-mask sum)
    taskset: str = "0"


def rewards_to_go(row: CodRow) -> list[float]:
    if row.kind == "solve_task":
        return [float(r) for r in row.task_rewards[row.position :]]
    if row.kind == "gen_hint":
        return [float(row.reward)] + [float(r) for r in row.task_rewards[row.position + 1 :]]
    raise InvalidArgument(
        f"a CoD row has exp_type {row.kind!r}; the cod advantage knows solve_task and gen_hint",
        field="algorithm.advantage_fn",
    )


def causal_return(rewards: Sequence[float], args: CodArgs) -> float:
    if args.e2e_causal_returns_style == "mean":
        return sum(rewards) / len(rewards)
    if args.e2e_causal_returns_style == "sliding_window_mean":
        head = rewards[: args.e2e_causal_returns_window]
        return sum(head) / len(head)
    return sum(r * args.e2e_causal_returns_gamma**k for k, r in enumerate(rewards))


def _weighted_sum(scores: Sequence[float], lengths: Sequence[int], temp: float | None) -> float:
    if temp is None:
        return sum(s * n for s, n in zip(scores, lengths, strict=True))
    return sum(s * math.exp(s / temp) * n for s, n in zip(scores, lengths, strict=True))


def adaptive_temperature(scores: Sequence[float], lengths: Sequence[int]) -> float | None:
    """T with the token-weighted re-weighted advantage near 0; None when it is not negative unweighted."""
    if _weighted_sum(scores, lengths, None) >= 0:
        return None
    low, high = 0.8, 100.0  # below 0.8 the weights grow too steep
    mid = (low + high) / 2
    for _ in range(20):
        mid = (low + high) / 2
        if _weighted_sum(scores, lengths, mid) < 0:
            high = mid
        else:
            low = mid
        if high - low < 0.05:
            break
    return mid


def cod_causal_scores(
    rows: Sequence[CodRow], args: CodArgs
) -> tuple[list[float], list[float], dict[str, float]]:
    """(advantage s' of each row, return R of each row, metrics) per the module docstring."""
    returns = [causal_return(rewards_to_go(row), args) for row in rows]
    per_episode: dict[tuple[str, str, int], dict[int, float]] = {}
    for row, ret in zip(rows, returns, strict=True):
        # the first row of a run for an episode stands for it (a multi-step episode's rows agree)
        per_episode.setdefault((row.task, row.kind, row.position), {}).setdefault(row.run, ret)
    baseline = {key: sum(runs.values()) / len(runs) for key, runs in per_episode.items()}
    scores = [ret - baseline[(r.task, r.kind, r.position)] for r, ret in zip(rows, returns, strict=True)]
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        level = args.red_weight_adaptive_level
        groups.setdefault(
            row.task if level == "task" else row.taskset if level == "taskset" else "", []
        ).append(i)
    out = list(scores)
    temps: list[float] = []
    for members in groups.values():
        s = [scores[i] for i in members]
        lengths = [rows[i].response_tokens for i in members]
        temp = adaptive_temperature(s, lengths) if args.red_weight_adaptive_temp else args.red_weight_temp
        shift = 0.0
        if args.red_weight_adv_shift and sum(lengths) > 0:
            mean = _weighted_sum(s, lengths, None) / sum(lengths)
            shift = mean if mean < 0 else 0.0
        for i in members:
            value = scores[i] * math.exp(scores[i] / temp) if temp else scores[i]
            out[i] = value - shift
        if temp is not None:
            temps.append(temp)
    metrics = {
        "experience_count": float(len(rows)),
        "active_weight_temp_mean": sum(temps) / len(temps) if temps else 0.0,
    }
    return out, returns, metrics


def cod(
    batch: TrainBatch,
    *,
    epsilon: float = 1e-6,
    enable_step_norm: bool = False,
    std_cal_level: str = "group",
    std_threshold: float | None = None,
    iterative_hint_e2e_causal: bool = False,
    mask_format_issue_exp: bool = False,
    e2e_causal_returns_style: str = "mean",
    e2e_causal_returns_window: int = -1,
    e2e_causal_returns_gamma: float = 1.0,
    e2e_causal_baseline: str = "group-mean",
    red_weight_temp: float | None = None,
    red_weight_adaptive_temp: bool = False,
    red_weight_adaptive_version: str | None = None,
    red_weight_adaptive_level: str | None = None,
    red_weight_adv_shift: bool = False,
) -> AdvantageOutput:
    """Trainer side: CoD rows arrive with advantages from the explorer; a row without them lacks the
    episode info the fn needs, so it is refused rather than guessed. The arguments are checked here
    too, so `trinity config check` names a bad one."""
    check_std_cal_level(std_cal_level)
    CodArgs(  # checks each setting, naming it
        e2e_causal_returns_style,
        e2e_causal_returns_window,
        e2e_causal_returns_gamma,
        e2e_causal_baseline,
        red_weight_temp,
        red_weight_adaptive_temp,
        red_weight_adaptive_version,
        red_weight_adaptive_level,
        red_weight_adv_shift,
    )
    raise InvalidArgument(
        "advantage_fn 'cod' is computed by the explorer's experience pipeline (it needs each episode's"
        " info exp_type, task_idx / hint_idx and task_rewards, which trainer rows do not carry); these"
        " rows arrived without advantages: write them through a trinity explorer with a cod: section"
        " and the cod_* workflows, or choose another advantage_fn (e.g. step_wise_grpo)",
        field="algorithm.advantage_fn",
    )
