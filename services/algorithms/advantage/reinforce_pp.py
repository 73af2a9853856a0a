"""REINFORCE++: discounted return-to-go, whitened over the batch's tokens.

    G_t = r_t + gamma * G_{t+1},  G_T = 0
    A   = whiten(G) over masked tokens = (G - mean) / sqrt(var_unbiased + 1e-8), then * mask

Paper: Hu, "REINFORCE++" (arXiv:2501.03262). Trinity-RFT default gamma 1.0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.advantage.base import AdvantageOutput
from services.algorithms.batch import TrainBatch
from services.algorithms.masked import masked_whiten


def reinforce_plus_plus_advantages(
    token_level_rewards: Tensor, action_mask: Tensor, *, gamma: float = 1.0
) -> tuple[Tensor, Tensor]:
    """token_level_rewards [B, T], action_mask [B, T] -> (advantages [B, T], returns [B, T])."""
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
    advantages = masked_whiten(returns, action_mask) * action_mask
    return advantages, returns


def reinforceplusplus(batch: TrainBatch, *, gamma: float = 1.0) -> AdvantageOutput:
    adv, ret = reinforce_plus_plus_advantages(
        batch.require("token_level_rewards"), batch.action_mask, gamma=gamma
    )
    return AdvantageOutput(adv, ret, {})
