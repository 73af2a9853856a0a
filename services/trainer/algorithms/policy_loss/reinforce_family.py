"""Policy losses built on log-probability (REINFORCE-style) rather than PPO's clipped ratio.

With ratio r_t = exp(logprob_t - old_logprob_t) and sg = stop-gradient:

    topr:                loss_t = -sg(alpha_t) * A_t * logprob_t,
                         alpha_t = clamp(r_t, 0, 1) if A_t <= advantage_threshold else 1
                         (TOPR, Roux et al. arXiv:2503.14286; default advantage_threshold 0.0; token mean)
    sppo:                loss_t = -A_t * (logprob_t - old_logprob_t) * [1/(1+epsilon) <= sg(r_t) <= 1+epsilon]
                         (sPPO, arXiv:2108.05828; default epsilon 0.3; token mean)
    rec:                 see rec.py
    importance_sampling: loss_t = -A_t * exp(clamp(logprob_t - old_logprob_t, -20, 20))
                         (no clipping; on-policy distillation's loss; default token-mean)

Names, arguments and defaults follow Trinity-RFT v0.5.2; metrics keep its names.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean
from services.trainer.algorithms.policy_loss.adapter import batch_loss


def topr_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    action_mask: Tensor,
    advantages: Tensor,
    *,
    advantage_threshold: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    ratio = torch.exp(logprob - old_logprob)
    alpha = torch.where(advantages <= advantage_threshold, ratio.clamp(0.0, 1.0), torch.ones_like(ratio))
    loss = masked_mean(-alpha.detach() * advantages * logprob, action_mask)
    return loss, {
        "topr_loss": loss.item(),
        "pg_loss": loss.item(),
        "avg_alpha": masked_mean(alpha, action_mask).item(),
        "avg_ratio": masked_mean(ratio, action_mask).item(),
    }


topr = batch_loss(topr_policy_loss, name="topr")


def _log_ratio_loss(
    logprob: Tensor, old_logprob: Tensor, action_mask: Tensor, advantages: Tensor, in_range: Tensor
) -> tuple[Tensor, dict[str, float]]:
    per_token = -advantages * (logprob - old_logprob) * in_range.float()
    loss = masked_mean(per_token, action_mask)
    return loss, {"pg_loss": loss.item(), "pg_clipfrac": masked_mean((~in_range).float(), action_mask).item()}


def sppo_policy_loss(
    logprob: Tensor, old_logprob: Tensor, action_mask: Tensor, advantages: Tensor, *, epsilon: float = 0.3
) -> tuple[Tensor, dict[str, float]]:
    ratio = torch.exp(logprob - old_logprob).detach()
    in_range = (ratio >= 1.0 / (1.0 + epsilon)) & (ratio <= 1.0 + epsilon)
    return _log_ratio_loss(logprob, old_logprob, action_mask, advantages, in_range)


sppo = batch_loss(sppo_policy_loss, name="sppo")


def importance_sampling_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    action_mask: Tensor,
    advantages: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    log_ratio = torch.clamp(logprob - old_logprob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss = aggregate_loss(-advantages * ratio, action_mask, loss_agg_mode)
    return loss, {
        "pg_loss": loss.item(),
        "ratio/mean": masked_mean(ratio, action_mask).item(),
        "approx_kl": masked_mean(-log_ratio, action_mask).item(),
    }


importance_sampling = batch_loss(importance_sampling_policy_loss, name="importance_sampling")
