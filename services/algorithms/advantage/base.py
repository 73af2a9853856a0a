"""What an advantage fn returns, and group statistics shared by the group-relative estimators."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class AdvantageOutput(NamedTuple):
    advantages: Tensor  # [B, T], zero on masked tokens
    returns: Tensor  # [B, T], critic targets (== advantages for critic-free estimators)
    metrics: dict[str, float]
    keep: Tensor | None = None  # [B] bool; False = row dropped (e.g. GRPO std_threshold), None = keep all


def sequence_scores(token_level_rewards: Tensor) -> Tensor:
    """[B, T] -> [B]: the outcome score of each sequence, sum over tokens (Trinity/veRL convention)."""
    return token_level_rewards.sum(dim=-1)


class GroupStats(NamedTuple):
    inverse: Tensor  # [B] long, dense group id of each row (0..G-1)
    sizes: Tensor  # [G] rows per group (float)
    mean: Tensor  # [G] mean score per group
    std: Tensor  # [G] unbiased std per group (0 for groups of one)


def group_stats(scores: Tensor, group_index: Tensor) -> GroupStats:
    """Per-group mean and unbiased (Bessel, n-1) std of scores[B], groups by equal group_index[B].

    Two-pass (mean first, then centred squares) like torch.std, so the numbers match it.
    """
    _, inverse = torch.unique(group_index, return_inverse=True)
    groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    scores = scores.to(torch.float32)
    count = torch.zeros(groups, dtype=torch.float32, device=scores.device).scatter_add_(
        0, inverse, torch.ones_like(scores)
    )
    total = torch.zeros_like(count).scatter_add_(0, inverse, scores)
    mean = total / count
    sq = torch.zeros_like(count).scatter_add_(0, inverse, (scores - mean[inverse]) ** 2)
    std = torch.where(count > 1, torch.sqrt(sq / (count - 1).clamp(min=1)), torch.zeros_like(sq))
    return GroupStats(inverse, count, mean, std)


def summary(prefix: str, values: Tensor) -> dict[str, float]:
    """{prefix}/mean, /max, /min of a 1-D tensor (Trinity's gather_metrics layout)."""
    if values.numel() == 0:
        return {}
    v = values.to(torch.float32)
    return {
        f"{prefix}/mean": v.mean().item(),
        f"{prefix}/max": v.max().item(),
        f"{prefix}/min": v.min().item(),
    }
