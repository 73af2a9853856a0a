"""Clipped value loss for the PPO critic (veRL / Trinity-RFT's critic).

    v_clip = clamp(v, v_old - cliprange_value, v_old + cliprange_value)
    loss   = 0.5 * aggregate(max((v - R)^2, (v_clip - R)^2), mask, loss_agg_mode)

Metrics: vf_loss, vf_clipfrac (share of tokens where the clipped error is larger), vpred_mean.
Papers: PPO (arXiv:1707.06347); value clipping as in OpenAI baselines. Default cliprange_value 0.5 (veRL).
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean


def clipped_value_loss(
    vpreds: Tensor,  # [B, T] current critic values (grad)
    returns: Tensor,  # [B, T] targets from the advantage fn
    old_values: Tensor,  # [B, T] critic values at rollout time
    action_mask: Tensor,  # [B, T]
    *,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    loss1 = (vpreds - returns) ** 2
    loss2 = (clipped - returns) ** 2
    vf_loss = 0.5 * aggregate_loss(torch.maximum(loss1, loss2), action_mask, loss_agg_mode)
    return vf_loss, {
        "vf_loss": vf_loss.item(),
        "vf_clipfrac": masked_mean(torch.gt(loss2, loss1).float(), action_mask).item(),
        "vpred_mean": masked_mean(vpreds, action_mask).item(),
    }
