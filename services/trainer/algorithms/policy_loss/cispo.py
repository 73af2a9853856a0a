"""CISPO: clipped importance-sampling weight as a stop-gradient coefficient of REINFORCE.

    ratio   = exp(logprob - old_logprob)
    w       = sg(clamp(ratio, 1 - clip_range_low, 1 + clip_range_high))
    m       = 1, or with enable_mask_clip:
              0 where (ratio > 1 + mask_clip_range_high and A > 0) or (ratio < 1 - mask_clip_range_low and A < 0)
    loss_t  = -A * w * m * logprob
    loss    = aggregate_loss(loss_t, action_mask, loss_agg_mode)

Unlike PPO's clip, the weight w is a constant, so a clipped token still passes gradient through
logprob; the optional token mask is what drops tokens that moved too far in the advantage's
direction. Metrics: cispo_loss, pg_loss, ppo_kl, unmasked_frac (share of tokens with m = 1;
`masked_frac` is the same figure under Trinity's earlier name).

Paper: MiniMax-M1 (arXiv:2506.13585). Trinity-RFT defaults: clip_range_low 1.0 (no lower bound),
clip_range_high 0.28, enable_mask_clip false with mask ranges 1.0 / 0.28, token-mean.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean
from services.trainer.algorithms.policy_loss.adapter import batch_loss


def cispo_policy_loss(
    logprob: Tensor,  # [B, T]
    old_logprob: Tensor,  # [B, T]
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    *,
    clip_range_low: float = 1.0,
    clip_range_high: float = 0.28,
    enable_mask_clip: bool = False,
    mask_clip_range_low: float = 1.0,
    mask_clip_range_high: float = 0.28,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, min=1.0 - clip_range_low, max=1.0 + clip_range_high).detach()
    keep = torch.ones_like(ratio)
    if enable_mask_clip:
        dropped = ((ratio > 1.0 + mask_clip_range_high) & (advantages > 0)) | (
            (ratio < 1.0 - mask_clip_range_low) & (advantages < 0)
        )
        keep = (~dropped).to(ratio.dtype).detach()
    per_token = -advantages * weight * keep * logprob
    loss = aggregate_loss(per_token, action_mask, loss_agg_mode)
    unmasked = masked_mean(keep, action_mask).item()
    return loss, {
        "cispo_loss": loss.item(),
        "pg_loss": loss.item(),
        "ppo_kl": masked_mean(-log_ratio, action_mask).item(),
        "unmasked_frac": unmasked,
        "masked_frac": unmasked,
    }


cispo = batch_loss(cispo_policy_loss, name="cispo")
