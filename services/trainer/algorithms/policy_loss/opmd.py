"""OPMD policy loss: REINFORCE on the current policy, scaled for the mirror-descent regulariser.

    loss = token_mean(-A * logprob) / (1 + tau)

Paper: Yao et al. (arXiv:2509.24203); Trinity-RFT's opmd loss (default tau 1.0). old_logprob unused.
"""

from __future__ import annotations

from torch import Tensor

from services.algorithms.masked import masked_mean
from services.trainer.algorithms.policy_loss.adapter import batch_loss


def opmd_policy_loss(
    logprob: Tensor, action_mask: Tensor, advantages: Tensor, *, tau: float = 1.0
) -> tuple[Tensor, dict[str, float]]:
    """logprob, action_mask, advantages [B, T] -> (loss, {"opmd_loss"})."""
    loss = masked_mean(-advantages * logprob, action_mask) / (1.0 + tau)
    return loss, {"opmd_loss": loss.item(), "pg_loss": loss.item()}


opmd = batch_loss(opmd_policy_loss, name="opmd")
