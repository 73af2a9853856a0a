"""GSPO: sequence-level importance ratio, applied token-wise (GSPO-token).

    s_i     = exp( mean_t (logprob - old_logprob) )                  sequence ratio (length-normalised)
    ratio_t = exp( logprob_t - sg(logprob_t) + sg(log s_i) )          value s_i, gradient of logprob_t
    loss_t  = max(-A * ratio_t, -A * clamp(ratio_t, 1 - low, 1 + high))
    pg_loss = aggregate(loss_t, mask, loss_agg_mode)                  default seq-mean-token-mean

Metrics: pg_loss, pg_clipfrac, ppo_kl (token mean), ppo_kl_seq (mean over sequences of -log s_i).
Paper: Zheng et al., GSPO (arXiv:2507.18071). Trinity-RFT defaults: clip_range_low 3e-4,
clip_range_high 4e-4, loss_agg_mode seq-mean-token-mean.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean
from services.trainer.algorithms.policy_loss.adapter import batch_loss
from services.trainer.algorithms.policy_loss.ppo import clip_args


def gspo_policy_loss(
    logprob: Tensor,  # [B, T]
    old_logprob: Tensor,  # [B, T]
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    *,
    clip_range_low: float = 3e-4,
    clip_range_high: float = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, float]]:
    log_ratio = logprob - old_logprob  # [B, T]
    log_ratio_seq = masked_mean(log_ratio, action_mask, dim=-1)  # [B]
    log_seq_ratio = logprob - logprob.detach() + log_ratio_seq.detach().unsqueeze(-1)  # [B, T]
    ratio = torch.exp(log_seq_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_range_low, 1.0 + clip_range_high)
    pg_loss = aggregate_loss(torch.maximum(loss1, loss2), action_mask, loss_agg_mode)
    return pg_loss, {
        "pg_loss": pg_loss.item(),
        "pg_clipfrac": masked_mean(torch.gt(loss2, loss1).float(), action_mask).item(),
        "ppo_kl": masked_mean(-log_ratio, action_mask).item(),
        "ppo_kl_seq": (-log_ratio_seq).mean().item(),
    }


# A single clip_range given by the user wins over the GSPO defaults of both bounds.
gspo = batch_loss(gspo_policy_loss, name="gspo", extra_args=("clip_range",), prepare=clip_args)
