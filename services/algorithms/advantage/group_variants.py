"""Group-baseline variants of REINFORCE: plain reward, AsymRE's shifted mean, REC's mean (optionally
std-normalised, optionally balancing positives and negatives).

    reinforce:  A_i = R_i                                   (no baseline; TOPR's default advantage)
    asymre:     A_i = R_i - (mean(R_group) + baseline_shift)   group of one: baseline 0
    rec:        A_i = R_i - mean(R_kept)                      (std_normalize: / (std_pop(R_kept) + epsilon))
                drop="balance": when a group has more rows below its mean than at/above it, drop the
                extra negatives at random (A = 0, keep=False); kept <= 1 row: mean 0, std 1.

Names, arguments and defaults as Trinity-RFT v0.5.2 (asymre baseline_shift -0.1, arXiv:2506.20520;
rec epsilon 1e-6, std_normalize False, drop None). R_i is the sequence score (sum of token rewards).
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.advantage.base import AdvantageOutput, group_stats, sequence_scores
from services.algorithms.batch import TrainBatch
from services.common.errors import InvalidArgument


def reinforce(batch: TrainBatch) -> AdvantageOutput:
    """A_i = R_i on every response token."""
    scores = sequence_scores(batch.require("token_level_rewards")).float()
    adv = scores.unsqueeze(-1) * batch.action_mask
    return AdvantageOutput(adv, adv.clone(), {"reward_mean": scores.mean().item()})


def asymre_advantages(
    scores: Tensor, action_mask: Tensor, group_index: Tensor, *, baseline_shift: float = -0.1
) -> Tensor:
    """scores [B], action_mask [B, T], group_index [B] -> advantages [B, T]."""
    stats = group_stats(scores, group_index)
    base = torch.where(stats.sizes > 1, stats.mean + baseline_shift, torch.zeros_like(stats.mean))
    return (scores.float() - base[stats.inverse]).unsqueeze(-1) * action_mask


def asymre(batch: TrainBatch, *, baseline_shift: float = -0.1) -> AdvantageOutput:
    adv = asymre_advantages(
        sequence_scores(batch.require("token_level_rewards")),
        batch.action_mask,
        batch.group_index,
        baseline_shift=baseline_shift,
    )
    return AdvantageOutput(adv, adv.clone(), {})


def rec_advantages(
    scores: Tensor,
    action_mask: Tensor,
    group_index: Tensor,
    *,
    epsilon: float = 1e-6,
    std_normalize: bool = False,
    drop: str | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """scores [B], action_mask [B, T], group_index [B] -> (advantages [B, T], keep [B] bool)."""
    if drop not in (None, "balance"):
        raise InvalidArgument(
            f"drop must be null or 'balance', got {drop!r}", field="algorithm.advantage_fn_args.drop"
        )
    s = scores.float()
    adv_seq = torch.zeros_like(s)
    keep = torch.ones_like(s, dtype=torch.bool)
    for g in torch.unique(group_index):
        rows = (group_index == g).nonzero(as_tuple=True)[0]
        r = s[rows]
        if drop == "balance" and rows.numel() > 1:
            negative = (r < r.mean()).nonzero(as_tuple=True)[0]
            extra = 2 * negative.numel() - rows.numel()  # negatives - positives
            if extra > 0:
                picked = negative[torch.randperm(negative.numel(), generator=generator)[:extra]]
                keep[rows[picked]] = False
        kept = keep[rows]
        if int(kept.sum()) <= 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = r[kept].mean(), r[kept].std(unbiased=False)
        value = (r - mean) / (std + epsilon) if std_normalize else r - mean
        adv_seq[rows] = torch.where(kept, value, torch.zeros_like(value))
    return adv_seq.unsqueeze(-1) * action_mask, keep


def rec(
    batch: TrainBatch, *, epsilon: float = 1e-6, std_normalize: bool = False, drop: str | None = None
) -> AdvantageOutput:
    adv, keep = rec_advantages(
        sequence_scores(batch.require("token_level_rewards")),
        batch.action_mask,
        batch.group_index,
        epsilon=epsilon,
        std_normalize=std_normalize,
        drop=drop,
    )
    dropped = float((~keep).sum().item())
    return AdvantageOutput(adv, adv.clone(), {"drop_balance": dropped / max(len(keep), 1)}, keep)
