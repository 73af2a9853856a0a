"""RLOO: REINFORCE leave-one-out baseline.

    A_i = R_i - mean_{j != i} R_j = n/(n-1) * (R_i - mean(R_group))      for a group of n >= 2
    A_i = R_i                                                            for a group of one

Paper: Ahmadian et al., "Back to Basics" (arXiv:2402.14740); Kool et al. 2019. As in Trinity-RFT.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.advantage.base import AdvantageOutput, group_stats, sequence_scores
from services.algorithms.batch import TrainBatch


def rloo_advantages(scores: Tensor, action_mask: Tensor, group_index: Tensor) -> Tensor:
    """scores [B], action_mask [B, T], group_index [B] -> advantages [B, T]."""
    stats = group_stats(scores, group_index)
    n = stats.sizes[stats.inverse]  # [B]
    loo = (scores.float() - stats.mean[stats.inverse]) * n / (n - 1).clamp(min=1)
    adv_seq = torch.where(n > 1, loo, scores.float())  # [B]
    return adv_seq.unsqueeze(-1) * action_mask


def rloo(batch: TrainBatch) -> AdvantageOutput:
    adv = rloo_advantages(
        sequence_scores(batch.require("token_level_rewards")), batch.action_mask, batch.group_index
    )
    return AdvantageOutput(adv, adv.clone(), {})
