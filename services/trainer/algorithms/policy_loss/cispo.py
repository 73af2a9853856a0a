"""CISPO: clipped importance-sampling weight as a stop-gradient coefficient of REINFORCE.

    ratio   = exp(logprob - old_logprob)
    w       = sg(clamp(ratio, 1 - clip_range_low, 1 + clip_range_high))
    m       = 0 where (ratio > 1 + high and A > 0) or (ratio < 1 - low and A < 0), else 1
    loss_t  = -A * w * m * logprob
    loss    = token mean over the mask

Metrics: cispo_loss, ppo_kl, masked_frac (share of tokens with m = 1; Trinity's name).
Paper: MiniMax-M1 (arXiv:2506.13585). Trinity-RFT defaults: clip_range_low 1.0 (no lower bound),
clip_range_high 0.28.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.trainer.algorithms.api import TrainBatch
from services.trainer.algorithms.masked import masked_mean


def cispo_policy_loss(
    logprob: Tensor,  # [B, T]
    old_logprob: Tensor,  # [B, T]
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    *,
    clip_range_low: float = 1.0,
    clip_range_high: float = 0.28,
) -> tuple[Tensor, dict[str, float]]:
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, min=1.0 - clip_range_low, max=1.0 + clip_range_high).detach()
    keep = ~(
        ((ratio > 1.0 + clip_range_high) & (advantages > 0))
        | ((ratio < 1.0 - clip_range_low) & (advantages < 0))
    )
    keep = keep.float().detach()
    per_token = -advantages * weight * keep * logprob
    loss = masked_mean(per_token, action_mask)
    return loss, {
        "cispo_loss": loss.item(),
        "pg_loss": loss.item(),
        "ppo_kl": masked_mean(-log_ratio, action_mask).item(),
        "masked_frac": masked_mean(keep, action_mask).item(),
    }


def cispo(
    batch: TrainBatch, logprob: Tensor, *, clip_range_low: float = 1.0, clip_range_high: float = 0.28
) -> tuple[Tensor, dict[str, float]]:
    return cispo_policy_loss(
        logprob,
        batch.require("old_logprob"),
        batch.action_mask,
        batch.require("advantages"),
        clip_range_low=clip_range_low,
        clip_range_high=clip_range_high,
    )
