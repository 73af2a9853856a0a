"""SFT: negative log-likelihood of the response tokens.

    use_token_level_loss=True:  loss = sum(-logprob * m) / sum(m)              (token mean)
    use_token_level_loss=False: loss = mean_b( sum_t(-logprob * m) / sum_t m )  (sequence mean)

Trinity-RFT's sft loss (default use_token_level_loss True).
"""

from __future__ import annotations

from torch import Tensor

from services.algorithms.masked import masked_mean
from services.trainer.algorithms.api import LossMetrics
from services.trainer.algorithms.policy_loss.adapter import batch_loss


def sft_loss(
    logprob: Tensor, action_mask: Tensor, *, use_token_level_loss: bool = True
) -> tuple[Tensor, LossMetrics]:
    """logprob, action_mask [B, T] -> (loss, {"sft_loss"})."""
    if use_token_level_loss:
        loss = masked_mean(-logprob, action_mask)
    else:
        loss = masked_mean(-logprob, action_mask, dim=1).mean()
    return loss, {"sft_loss": loss.detach()}


sft = batch_loss(sft_loss, name="sft")
