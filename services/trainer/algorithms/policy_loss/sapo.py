"""SAPO: soft adaptive policy optimisation, PPO's hard clip replaced by a temperature-controlled gate.

    r_t     = exp(logprob_t - old_logprob_t)
    tau_t   = tau_pos if A_t > 0 else tau_neg
    f(r)    = sigmoid(tau * (r - 1)) * 4 / tau          (f(1) = 2 / tau)
    loss_t  = -A_t * sg(f(r_t)) * logprob_t             (Trinity-RFT's form: the gate weighs the
                                                        REINFORCE gradient; the paper differentiates
                                                        f(r) itself, whose gradient at r = 1 is A)
    pg_loss = aggregate(loss_t, mask, loss_agg_mode)

Paper: Gao et al., "Soft Adaptive Policy Optimization" (arXiv:2511.20347). Trinity-RFT v0.5.2 names
and defaults: tau_pos 1.0, tau_neg 1.05 (must be >= tau_pos), loss_agg_mode token-mean. Metrics
(Trinity's names): sapo_loss, ppo_kl, avg_soft_gate, avg_ratio, pos_adv_frac; pg_loss as well.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean
from services.common.errors import InvalidArgument
from services.trainer.algorithms.policy_loss.adapter import batch_loss


def sapo_policy_loss(
    logprob: Tensor,  # [B, T]
    old_logprob: Tensor,  # [B, T]
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    if tau_pos <= 0 or tau_neg < tau_pos:
        raise InvalidArgument(
            f"need 0 < tau_pos <= tau_neg, got tau_pos {tau_pos}, tau_neg {tau_neg}",
            field="algorithm.policy_loss_fn_args",
        )
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    loss = aggregate_loss(-advantages * gate.detach() * logprob, action_mask, loss_agg_mode)
    return loss, {
        "sapo_loss": loss.item(),
        "pg_loss": loss.item(),
        "ppo_kl": masked_mean(-log_ratio, action_mask).item(),
        "avg_soft_gate": masked_mean(gate, action_mask).item(),
        "avg_ratio": masked_mean(ratio, action_mask).item(),
        "pos_adv_frac": masked_mean((advantages > 0).float(), action_mask).item(),
    }


sapo = batch_loss(sapo_policy_loss, name="sapo")
