"""GiGPO (Group-in-Group Policy Optimization; Feng et al., arXiv:2505.10978): two-level advantages.

Each row is one step (one model call) of a multi-turn run. With r_t the step's reward, in step order:

    R_t  = sum_{k>=t} gamma^(k-t) r_k                  discounted return from step t (per run)
    A_E  = norm_task(sum_t r_t)                        episode level: the run's total reward against
                                                       the other runs of its task
    A_S  = norm_anchor(R_t)                            step level: the return from step t against the
                                                       returns of every step that saw the same
                                                       environment state (its anchor key); 0 for a
                                                       row without a key or alone under its key
    A    = A_E + omega * A_S, broadcast over the step's action mask

    norm(x_i) = (x_i - mean(x)) / (d + epsilon),  d = unbiased std of x (fnorm "std") or 1 ("none");
                a group of one value: mean 0, d 1 (x / (1 + epsilon)).

Trinity-RFT's gigpo advantage fn (trinity/algorithm/advantage_fn/gigpo_advantage.py): names and
defaults omega 1.0, gamma 1.0, fnorm "none", epsilon 1e-6, step_reward_key "step_reward",
env_state_hash_key "env_state_hash". As there, anchor groups span every row the fn is handed (the
whole explorer step), not one task: the key itself (a hash of the observation) says which states
are the same. No row is dropped. It runs in the explorer's pipeline
(services/explorer/pipeline/gigpo.py), where a step's runs are all present and the rows' info
(the anchor key) is at hand; the trainer's rows do not carry that info.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from services.algorithms.advantage.base import AdvantageOutput
from services.algorithms.batch import TrainBatch
from services.common.errors import InvalidArgument

FNORMS = ("std", "none")


def check_fnorm(fnorm: str) -> None:
    if fnorm not in FNORMS:
        raise InvalidArgument(
            f"fnorm must be one of {', '.join(FNORMS)}, got {fnorm!r}",
            field="algorithm.advantage_fn_args.fnorm",
        )


def _normalize(values: list[float], fnorm: str, epsilon: float) -> list[float]:
    x = torch.tensor(values, dtype=torch.float64)
    if x.numel() == 1:
        mean, denom = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    else:
        mean = x.mean()
        denom = x.std() if fnorm == "std" else torch.tensor(1.0, dtype=torch.float64)
    return ((x - mean) / (denom + epsilon)).tolist()


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """R_t = r_t + gamma * R_{t+1}, from the last step back."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def gigpo_scores(
    step_rewards: Sequence[float],  # [B] r_t of each row
    task_index: Sequence[int],  # [B] rows of one task share it
    run_index: Sequence[int],  # [B] rows of one run share it (unique across tasks)
    step_order: Sequence[int],  # [B] rows of a run sorted by it give the step order
    anchor_keys: Sequence[str | None],  # [B] the environment state the step saw; None: no anchor
    *,
    omega: float = 1.0,
    gamma: float = 1.0,
    fnorm: str = "none",
    epsilon: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """Returns (A of each row [B], metrics), before broadcasting over tokens. Metrics (Trinity's, less
    its "gigpo/" prefix: the pipeline names the operator): anchor_groups_total, anchor_groups_size_gt1,
    anchor_group_hit_ratio (their ratio), mean_abs_A_E, mean_abs_A_S."""
    check_fnorm(fnorm)
    rows_of_run: dict[int, list[int]] = {}
    for row, run in enumerate(run_index):
        rows_of_run.setdefault(run, []).append(row)
    ret = [0.0] * len(step_rewards)
    episode: dict[int, float] = {}
    for run, rows in rows_of_run.items():
        rows.sort(key=lambda r: step_order[r])
        rewards = [float(step_rewards[r]) for r in rows]
        for r, value in zip(rows, discounted_returns(rewards, gamma), strict=True):
            ret[r] = value
        episode[run] = sum(rewards)
    a_episode: dict[int, float] = {}
    runs_of_task: dict[int, list[int]] = {}
    for run, rows in rows_of_run.items():
        runs_of_task.setdefault(task_index[rows[0]], []).append(run)
    for runs in runs_of_task.values():
        a_episode.update(zip(runs, _normalize([episode[r] for r in runs], fnorm, epsilon), strict=True))
    anchors: dict[str, list[int]] = {}
    for row, key in enumerate(anchor_keys):
        if key is not None:
            anchors.setdefault(key, []).append(row)
    a_step = [0.0] * len(step_rewards)
    shared = 0
    for rows in anchors.values():
        if len(rows) < 2:
            continue
        shared += 1
        for r, value in zip(rows, _normalize([ret[r] for r in rows], fnorm, epsilon), strict=True):
            a_step[r] = value
    a_e = [a_episode[run] for run in run_index]
    scores = torch.tensor([e + omega * s for e, s in zip(a_e, a_step, strict=True)], dtype=torch.float32)
    n = max(len(a_e), 1)
    metrics = {
        "anchor_groups_total": float(len(anchors)),
        "anchor_groups_size_gt1": float(shared),
        "anchor_group_hit_ratio": shared / len(anchors) if anchors else 0.0,
        "mean_abs_A_E": sum(abs(v) for v in a_e) / n,
        "mean_abs_A_S": sum(abs(v) for v in a_step) / n,
    }
    return scores, metrics


def gigpo(
    batch: TrainBatch,
    *,
    omega: float = 1.0,
    gamma: float = 1.0,
    fnorm: str = "none",
    epsilon: float = 1e-6,
    step_reward_key: str = "step_reward",
    env_state_hash_key: str = "env_state_hash",
) -> AdvantageOutput:
    """Trainer side: GiGPO rows arrive with advantages from the explorer and skip this step; a row
    without them lacks the anchor key (experience info), so it is refused rather than guessed."""
    check_fnorm(fnorm)
    raise InvalidArgument(
        "advantage_fn 'gigpo' is computed by the explorer's experience pipeline (it needs each step's"
        f" info {env_state_hash_key!r} and {step_reward_key!r}, which trainer rows do not carry);"
        " these rows arrived without advantages: write them through a trinity explorer, or have the"
        " workflow fill Experience.advantages, or choose another advantage_fn (e.g. step_wise_grpo)",
        field="algorithm.advantage_fn",
    )
