"""OPMD (online policy mirror descent) advantage: reward minus a group baseline.

    A_i = R_i - b_group,   b = mean(R_group)                                  (opmd_baseline="mean")
                           b = tau * log(mean_j exp(R_j / tau))               (opmd_baseline="logavgexp")
    group of one: b = 0.

Paper: Yao et al., "Group-relative REINFORCE is secretly an off-policy algorithm" (arXiv:2509.24203);
Trinity-RFT's opmd advantage (defaults opmd_baseline "mean", tau 1.0).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from services.algorithms.advantage.base import AdvantageOutput, group_stats, sequence_scores
from services.algorithms.batch import TrainBatch
from services.common.errors import InvalidArgument


def opmd_advantages(
    scores: Tensor, action_mask: Tensor, group_index: Tensor, *, opmd_baseline: str = "mean", tau: float = 1.0
) -> Tensor:
    """scores [B], action_mask [B, T], group_index [B] -> advantages [B, T]."""
    stats = group_stats(scores, group_index)
    s = scores.float()
    if opmd_baseline == "mean":
        base = stats.mean
    elif opmd_baseline == "logavgexp":
        groups = stats.sizes.numel()
        # logsumexp per group, stabilised by the group max
        gmax = torch.full((groups,), -math.inf, device=s.device).scatter_reduce(
            0, stats.inverse, s / tau, "amax"
        )
        sumexp = torch.zeros(groups, device=s.device).scatter_add_(
            0, stats.inverse, torch.exp(s / tau - gmax[stats.inverse])
        )
        base = tau * (gmax + torch.log(sumexp) - torch.log(stats.sizes))
    else:
        raise InvalidArgument(
            f"opmd_baseline must be 'mean' or 'logavgexp', got {opmd_baseline!r}",
            field="algorithm.advantage_fn_args.opmd_baseline",
        )
    base = torch.where(stats.sizes > 1, base, torch.zeros_like(base))
    return (s - base[stats.inverse]).unsqueeze(-1) * action_mask


def opmd(batch: TrainBatch, *, opmd_baseline: str = "mean", tau: float = 1.0) -> AdvantageOutput:
    adv = opmd_advantages(
        sequence_scores(batch.require("token_level_rewards")),
        batch.action_mask,
        batch.group_index,
        opmd_baseline=opmd_baseline,
        tau=tau,
    )
    return AdvantageOutput(adv, adv.clone(), {})
