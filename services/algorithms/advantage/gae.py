"""PPO's advantage: generalised advantage estimation (GAE) with a critic, then whitening.

    delta_t = r_t + gamma * V_{t+1} - V_t           (V_T = 0 after the last position)
    A_t     = delta_t + gamma * lam * A_{t+1}
    returns = A + V                                  (critic targets, before whitening)
    A       = whiten(A) over masked tokens, then * mask

Paper: Schulman et al., GAE (arXiv:1506.02438); PPO (arXiv:1707.06347). Trinity-RFT defaults gamma 1.0,
lam 1.0. values [B, T] are the critic's values at rollout time (zero them on padding).
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.advantage.base import AdvantageOutput
from services.algorithms.batch import TrainBatch
from services.algorithms.masked import masked_whiten
from services.common.errors import InvalidArgument


def gae_advantages(
    token_level_rewards: Tensor, values: Tensor, action_mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """token_level_rewards, values, action_mask [B, T] -> (advantages [B, T] whitened, returns [B, T])."""
    last = torch.zeros_like(token_level_rewards[:, 0])
    reversed_adv = []
    length = token_level_rewards.shape[-1]
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t < length - 1 else torch.zeros_like(last)
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        reversed_adv.append(last)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, action_mask) * action_mask, returns


def ppo(batch: TrainBatch, *, gamma: float = 1.0, lam: float = 1.0) -> AdvantageOutput:
    if batch.values is None:
        raise InvalidArgument(
            "advantage_fn 'ppo' (GAE) needs critic values; set algorithm.use_critic true",
            field="algorithm.advantage_fn",
        )
    adv, ret = gae_advantages(
        batch.require("token_level_rewards"), batch.require("values"), batch.action_mask, gamma=gamma, lam=lam
    )
    return AdvantageOutput(adv, ret, {})


def none(batch: TrainBatch) -> AdvantageOutput:
    """No advantage (SFT, DPO): zeros, so nothing downstream reads stale values."""
    zeros = torch.zeros_like(batch.action_mask, dtype=torch.float32)
    return AdvantageOutput(zeros, zeros.clone(), {})
