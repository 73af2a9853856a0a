"""Step-wise GRPO (multi_step_grpo): GRPO over each run's final reward, broadcast to every step of the run.

A run is one multi-turn rollout; each model call in it is one row (one step). Per task group:

    R_run   = reward of the run's last step (highest step index)
    A_run   = (R_run - mean_task(R)) / (std + epsilon)   std: unbiased over the task's runs
                                                         (std_cal_level "group") or over every run's
                                                         final reward in the batch ("batch"); "none":
                                                         A_run = R_run - mean_task(R); a task with
                                                         one run: mean 0, std 1
    A_t     = A_run * mask_t on every step of the run    (/ steps in the run when enable_step_norm)
    std_threshold: tasks with one run or std <= threshold are dropped (keep False, A = 0).

Trinity-RFT's step_wise_grpo (inspired by rLLM): names and defaults epsilon 1e-6,
enable_step_norm False, std_cal_level group, std_threshold None. As in Trinity it runs in the
explorer's experience pipeline (services/explorer/pipeline/step_wise.py), where every run of a task
is in one step's experiences; the trainer's advantage fn uses the same scores for rows written
without advantages.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.common.errors import InvalidArgument

STD_LEVELS = ("group", "batch", "none")


def check_std_cal_level(level: str) -> None:
    if level not in STD_LEVELS:
        raise InvalidArgument(
            f"std_cal_level must be one of {', '.join(STD_LEVELS)}, got {level!r}",
            field="algorithm.advantage_fn_args.std_cal_level",
        )


def step_wise_grpo_scores(
    rewards: Tensor,  # [B] reward of each step row
    task_index: Tensor,  # [B] long, rows of one task share it
    run_index: Tensor,  # [B] long, rows of one run share it (unique across tasks)
    step_index: Tensor,  # [B] long, position of the row in its run
    *,
    epsilon: float = 1e-6,
    enable_step_norm: bool = False,
    std_cal_level: str = "group",
    std_threshold: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Returns (advantage of each row's run [B], keep [B] bool), before broadcasting over tokens."""
    check_std_cal_level(std_cal_level)
    runs = torch.unique(run_index)
    final: dict[int, float] = {}
    steps: dict[int, int] = {}
    run_task: dict[int, int] = {}
    for run in runs.tolist():
        rows = (run_index == run).nonzero(as_tuple=True)[0]
        last = rows[step_index[rows].argmax()]
        final[run], steps[run], run_task[run] = float(rewards[last]), rows.numel(), int(task_index[last])
    all_final = torch.tensor(list(final.values()))
    batch_std = all_final.std() if all_final.numel() > 1 else torch.tensor(1.0)
    score: dict[int, float] = {}
    dropped: set[int] = set()
    for task in set(run_task.values()):
        members = [r for r in final if run_task[r] == task]
        r = torch.tensor([final[m] for m in members])
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(members) == 1 else (r.mean(), r.std())
        if std_threshold is not None and (len(members) == 1 or std <= std_threshold):
            dropped |= set(members)
        for m, value in zip(members, r, strict=True):
            if std_cal_level == "none":
                score[m] = float(value - mean)
            else:
                denom = batch_std if std_cal_level == "batch" else std
                score[m] = float((value - mean) / (denom + epsilon))
    adv_seq = torch.zeros(rewards.shape[0])
    keep = torch.ones(rewards.shape[0], dtype=torch.bool)
    for i, run in enumerate(run_index.tolist()):
        if run in dropped:
            keep[i] = False
            continue
        adv_seq[i] = score[run] / steps[run] if enable_step_norm else score[run]
    return adv_seq, keep


def step_wise_grpo_advantages(
    rewards: Tensor,  # [B] reward of each step row
    action_mask: Tensor,  # [B, T]
    task_index: Tensor,  # [B] long
    run_index: Tensor,  # [B] long
    step_index: Tensor,  # [B] long
    *,
    epsilon: float = 1e-6,
    enable_step_norm: bool = False,
    std_cal_level: str = "group",
    std_threshold: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Returns (advantages [B, T], keep [B] bool); see step_wise_grpo_scores."""
    adv_seq, keep = step_wise_grpo_scores(
        rewards,
        task_index,
        run_index,
        step_index,
        epsilon=epsilon,
        enable_step_norm=enable_step_norm,
        std_cal_level=std_cal_level,
        std_threshold=std_threshold,
    )
    return adv_seq.unsqueeze(-1) * action_mask, keep
