"""REC: REINFORCE on the current logprob, with token masking by ratio and optional weights/regulariser.

With r_t = sg(exp(logprob_t - old_logprob_t)) and s_i = exp(mean_t (logprob - old_logprob)) (row i):

    in_range_t by clip_mode:
        none           always
        two-side       1 - eps_low <= r_t <= 1 + eps_high
        one-side       (A_t >= 0 and r_t <= 1 + eps_high) or (A_t <= 0 and r_t >= 1 - eps_low)
        gspo-one-side  the same with s_i in place of r_t
        ring           two-side, or (A_t >= 0 and r_t <= 1 - eps_low'), or (A_t <= 0 and r_t >= 1 + eps_high')
    A'_t by weight: none A_t; importance_sampling A_t * r_t; gspo_importance_sampling A_t * s_i;
        advantage A_t * exp(A_t / temp)
    loss_t = -A'_t * logprob_t * in_range_t  (+ coef * (logprob_t - old_logprob_t)^2 for regularizer k2,
             - coef * logprob_t for regularizer forward-kl)
    pg_loss = token mean of loss_t (seq-mean-token-mean for gspo-one-side); pg_clipfrac = share masked.

Trinity-RFT v0.5.2's REC loss: names and defaults epsilon_low 0.2, epsilon_high 0.2, epsilon_low_prime
0.6, epsilon_high_prime 2.0, clip_mode none, weight none, regularizer none, regularizer_coef 0.0, temp 1.0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean
from services.common.errors import InvalidArgument
from services.trainer.algorithms.policy_loss.adapter import batch_loss

CLIP_MODES = ("none", "one-side", "gspo-one-side", "two-side", "ring")
WEIGHTS = ("none", "importance_sampling", "gspo_importance_sampling", "advantage")
REGULARIZERS = ("none", "k2", "forward-kl")
_KEY = "algorithm.policy_loss_fn_args"


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidArgument(
            f"{name} must be one of {', '.join(allowed)}; got {value!r}", field=f"{_KEY}.{name}"
        )


def rec_policy_loss(
    logprob: Tensor,  # [B, T]
    old_logprob: Tensor,  # [B, T]
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    epsilon_low_prime: float = 0.6,
    epsilon_high_prime: float = 2.0,
    clip_mode: str = "none",
    weight: str = "none",
    regularizer: str = "none",
    regularizer_coef: float = 0.0,
    temp: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    _check("clip_mode", clip_mode, CLIP_MODES)
    _check("weight", weight, WEIGHTS)
    _check("regularizer", regularizer, REGULARIZERS)
    if not (
        0.0 < epsilon_low <= 1.0
        and epsilon_high > 0
        and 0.0 < epsilon_low_prime <= 1.0
        and epsilon_high_prime > 0
    ):
        raise InvalidArgument(
            "epsilon_low(_prime) must be in (0, 1] and epsilon_high(_prime) > 0", field=_KEY
        )
    if regularizer_coef < 0 or temp <= 0:
        raise InvalidArgument(
            f"need regularizer_coef >= 0 and temp > 0, got {regularizer_coef}, {temp}", field=_KEY
        )
    ratio = torch.exp(logprob - old_logprob).detach()
    seq_ratio = (
        torch.exp(masked_mean(logprob - old_logprob, action_mask, dim=-1)).detach().unsqueeze(-1)
    )  # [B, 1]
    pos, neg = advantages >= 0, advantages <= 0
    band = (ratio >= 1 - epsilon_low) & (ratio <= 1 + epsilon_high)
    if clip_mode == "two-side":
        in_range = band
    elif clip_mode == "one-side":
        in_range = (pos & (ratio <= 1 + epsilon_high)) | (neg & (ratio >= 1 - epsilon_low))
    elif clip_mode == "gspo-one-side":
        in_range = (pos & (seq_ratio <= 1 + epsilon_high)) | (neg & (seq_ratio >= 1 - epsilon_low))
    elif clip_mode == "ring":
        in_range = band | (pos & (ratio <= 1 - epsilon_low_prime)) | (neg & (ratio >= 1 + epsilon_high_prime))
    else:
        in_range = torch.ones_like(ratio, dtype=torch.bool)
    if weight == "importance_sampling":
        advantages = advantages * ratio
    elif weight == "gspo_importance_sampling":
        advantages = advantages * seq_ratio
    elif weight == "advantage":
        advantages = advantages * torch.exp(advantages / temp)
    per_token = -advantages * logprob * in_range.float()
    if regularizer == "forward-kl":
        per_token = per_token - regularizer_coef * logprob
    elif regularizer == "k2":
        per_token = per_token + regularizer_coef * (logprob - old_logprob).square()
    mode = "seq-mean-token-mean" if clip_mode == "gspo-one-side" else "token-mean"
    loss = aggregate_loss(per_token, action_mask, mode)
    return loss, {"pg_loss": loss.item(), "pg_clipfrac": masked_mean((~in_range).float(), action_mask).item()}


rec = batch_loss(rec_policy_loss, name="rec")
