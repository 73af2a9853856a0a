"""DPO: Bradley-Terry preference loss against a frozen reference.

Rows come in pairs: 2k is chosen, 2k+1 is rejected (batch.pair_index marks the pair).

    r_c = sum_t m * (logprob - ref_logprob)  over the chosen row,   r_r likewise for the rejected row
    z   = r_c - r_r
    loss = mean_pairs( -(1 - eps) * logsigmoid(beta * z) - eps * logsigmoid(-beta * z) )   eps = label_smoothing

Metrics (Trinity-RFT names): dpo_loss, chosen_reward = beta * mean(r_c), rejected_reward = beta * mean(r_r),
accuracy_mean = share of pairs with r_c > r_r. Paper: Rafailov et al. (arXiv:2305.18290);
defaults beta 0.1, label_smoothing 0.0 (cDPO when > 0).

Differs from Trinity-RFT v0.5.2 on purpose: Trinity sums the log-ratios of all chosen rows and of all
rejected rows of a micro-batch and applies the logsigmoid once, i.e. treats the micro-batch as a single
pair; here each (2k, 2k+1) pair gets its own logsigmoid and the loss is their mean (the paper's
definition). The two agree when a micro-batch holds one pair. Trinity's arguments (beta,
label_smoothing) are accepted unchanged.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from services.algorithms.batch import TrainBatch
from services.algorithms.masked import masked_sum
from services.common.errors import InvalidArgument
from services.trainer.algorithms.policy_loss.adapter import batch_loss


def dpo_loss(
    logprob: Tensor,  # [2P, T], rows 2k chosen / 2k+1 rejected
    ref_logprob: Tensor,  # [2P, T]
    action_mask: Tensor,  # [2P, T]
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    if logprob.shape[0] % 2:
        raise InvalidArgument(
            f"DPO needs an even number of rows (chosen, rejected pairs), got {logprob.shape[0]}",
            field="batch.pair_index",
        )
    chosen = masked_sum(logprob[::2] - ref_logprob[::2], action_mask[::2], dim=-1)  # [P]
    rejected = masked_sum(logprob[1::2] - ref_logprob[1::2], action_mask[1::2], dim=-1)  # [P]
    logits = chosen - rejected
    losses = (
        -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    )
    loss = losses.mean()
    return loss, {
        "dpo_loss": loss.item(),
        "chosen_reward": beta * chosen.detach().mean().item(),
        "rejected_reward": beta * rejected.detach().mean().item(),
        "accuracy_mean": (chosen.detach() > rejected.detach()).float().mean().item(),
    }


def check_pairs(batch: TrainBatch, args: dict[str, Any]) -> dict[str, Any]:
    """The reference logprobs are there and rows 2k, 2k+1 share a pair_index (when it is set)."""
    if batch.ref_logprob is None:
        raise InvalidArgument("DPO needs ref_logprob from the reference model", field="batch.ref_logprob")
    if batch.pair_index is not None and batch.pair_index.numel() >= 2:
        pairs = batch.pair_index.view(-1, 2) if batch.pair_index.numel() % 2 == 0 else None
        if pairs is None or not bool((pairs[:, 0] == pairs[:, 1]).all()):
            raise InvalidArgument(
                "rows 2k and 2k+1 must share a pair_index (chosen, rejected)", field="batch.pair_index"
            )
    return args


dpo = batch_loss(dpo_loss, name="dpo", prepare=check_pairs)
