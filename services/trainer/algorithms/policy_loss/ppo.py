"""PPO clipped surrogate with asymmetric clip range and dual-clip.

    ratio  = exp(clamp(logprob - old_logprob, -20, 20))
    L1     = -A * ratio
    L2     = -A * clamp(ratio, 1 - clip_range_low, 1 + clip_range_high)
    Lclip  = max(L1, L2)
    L3     = -A * clip_ratio_c                              (dual-clip, only where A < 0)
    loss_t = min(Lclip, L3) if A < 0 else Lclip
    pg_loss = aggregate(loss_t, mask, loss_agg_mode)

Metrics (Trinity-RFT names): pg_loss; pg_clipfrac = share of tokens where L2 > L1; pg_clipfrac_lower
= share where the dual clip bites (A < 0 and Lclip > L3); ppo_kl = mean(old_logprob - logprob).
Papers: Schulman et al. PPO (arXiv:1707.06347); dual-clip: Ye et al. (arXiv:1912.09729); clip-higher:
DAPO (arXiv:2503.14476). Defaults as Trinity-RFT: clip_range 0.2, clip_ratio_c 3.0, token-mean.

Trinity v0.5.2 options (DeepSeek-V3.2's off-policy sequence masking):
    enable_sequence_masking: per row, kl_seq = sum_t m * (old_logprob - logprob) / (sum_t m + 1e-10);
        tokens with A < 0 in rows with kl_seq > delta_sequence_masking (default 0.1) get loss 0.
        Metrics seq_mask/masked_tokens (share of unmasked tokens zeroed), seq_mask/mean_sequence_kl.
    fallback_to_policy_gradient: ratio = exp(logprob - sg(logprob)) (value 1, gradient of logprob):
        ignores the behaviour logprobs, e.g. when the engine's logprobs disagree with the trainer's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from services.algorithms.batch import TrainBatch
from services.algorithms.masked import aggregate_loss, masked_mean
from services.common.errors import InvalidArgument
from services.trainer.algorithms.api import LossMetrics
from services.trainer.algorithms.policy_loss.adapter import batch_loss


def clip_args(batch: TrainBatch, args: dict[str, Any]) -> dict[str, Any]:
    """Trinity's single `clip_range` sets clip_range_low / clip_range_high where the user gave neither.

    A bound left unset (or None) keeps the loss's own default; `clip_range: null` with a bound
    missing is refused rather than silently replaced by the default.
    """
    given = "clip_range" in args
    clip_range = args.pop("clip_range", None)
    for bound in ("clip_range_low", "clip_range_high"):
        if args.get(bound) is not None:
            continue
        args.pop(bound, None)
        if clip_range is not None:
            args[bound] = clip_range
        elif given:
            raise InvalidArgument(
                "set clip_range or both clip_range_low and clip_range_high",
                field="algorithm.policy_loss_fn_args",
            )
    return args


def ppo_policy_loss(
    logprob: Tensor,  # [B, T] current policy, carries grad
    old_logprob: Tensor,  # [B, T] behaviour policy
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    *,
    clip_range_low: float = 0.2,
    clip_range_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    enable_sequence_masking: bool = False,
    delta_sequence_masking: float = 0.1,
    fallback_to_policy_gradient: bool = False,
) -> tuple[Tensor, LossMetrics]:
    if clip_ratio_c <= 1.0:
        raise InvalidArgument(
            f"clip_ratio_c must be > 1, got {clip_ratio_c}",
            field="algorithm.policy_loss_fn_args.clip_ratio_c",
        )
    behaviour = logprob.detach() if fallback_to_policy_gradient else old_logprob
    log_ratio = torch.clamp(logprob - behaviour, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, action_mask)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_range_low, 1.0 + clip_range_high)
    clipped = torch.maximum(loss1, loss2)
    clipfrac = masked_mean(torch.gt(loss2, loss1).float(), action_mask)
    loss3 = -advantages * clip_ratio_c
    negative = advantages < 0
    clipfrac_lower = masked_mean((torch.gt(clipped, loss3) & negative).float(), action_mask)
    per_token = torch.where(negative, torch.minimum(clipped, loss3), clipped)
    extra: dict[str, float] = {}
    if enable_sequence_masking:
        seq_kl = (-log_ratio * action_mask).sum(dim=-1) / (action_mask.sum(dim=-1) + 1e-10)  # [B]
        masked = negative & (seq_kl > delta_sequence_masking).unsqueeze(-1)  # [B, T]
        per_token = per_token * (~masked).float()
        extra = {
            "seq_mask/masked_tokens": masked.float().sum().item() / (action_mask.sum().item() + 1e-10),
            "seq_mask/mean_sequence_kl": seq_kl.mean().item(),
        }
    pg_loss = aggregate_loss(per_token, action_mask, loss_agg_mode)
    return pg_loss, {
        "pg_loss": pg_loss.detach(),
        "pg_clipfrac": clipfrac.detach(),
        "pg_clipfrac_lower": clipfrac_lower.detach(),
        "ppo_kl": ppo_kl.detach(),
        **extra,
    }


ppo = batch_loss(ppo_policy_loss, name="ppo", extra_args=("clip_range",), prepare=clip_args)
