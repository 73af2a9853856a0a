"""GRPO: group-relative advantage.

    A_i = (R_i - mean(R_group)) / (std(R_group) + epsilon)       broadcast over the response tokens

R_i is the sequence score (sum of token_level_rewards), groups are rows with equal group_index
(the repeat_times rollouts of one task in one step), std is unbiased (torch.std). Group of one:
mean 0, std 1 (Trinity's choice, so the row keeps its raw reward as advantage). std_cal_level="batch"
takes the std over the whole batch while the mean stays per group (arXiv:2508.08221).
std_threshold: groups whose std <= threshold carry no signal and are dropped (keep=False), as are
groups of one; Trinity removes them from the batch, the trainer masks them out.

Paper: Shao et al., DeepSeekMath (arXiv:2402.03300). Defaults as Trinity-RFT (epsilon 1e-6).
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.algorithms.advantage.base import AdvantageOutput, group_stats, sequence_scores, summary
from services.algorithms.batch import TrainBatch
from services.common.errors import InvalidArgument


def _all_equal(scores: Tensor, inverse: Tensor, groups: int) -> Tensor:
    """[G] bool: every score of the group is the same number."""
    low = torch.full((groups,), float("inf"), device=scores.device).scatter_reduce(0, inverse, scores, "amin")
    high = torch.full((groups,), float("-inf"), device=scores.device).scatter_reduce(
        0, inverse, scores, "amax"
    )
    return low == high


def grpo_advantages(
    scores: Tensor,  # [B]
    action_mask: Tensor,  # [B, T]
    group_index: Tensor,  # [B] long
    *,
    epsilon: float = 1e-6,
    std_threshold: float | None = None,
    std_cal_level: str = "group",
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """Returns (advantages [B, T], keep [B] bool, metrics)."""
    if std_cal_level not in ("group", "batch"):
        raise InvalidArgument(
            f"std_cal_level must be 'group' or 'batch', got {std_cal_level!r}",
            field="algorithm.advantage_fn_args.std_cal_level",
        )
    stats = group_stats(scores, group_index)
    single = stats.sizes == 1  # [G]
    mean = torch.where(single, torch.zeros_like(stats.mean), stats.mean)  # [G]
    std = torch.where(single, torch.ones_like(stats.std), stats.std)  # [G]
    if std_cal_level == "batch":
        batch_std = scores.float().std() if scores.numel() > 1 else torch.tensor(1.0)
        denom = batch_std.expand_as(std)
    else:
        denom = std
    adv_seq = (scores.float() - mean[stats.inverse]) / (denom[stats.inverse] + epsilon)  # [B]
    # A group whose scores are all equal has R_i - mean = 0 exactly; the float mean of eight 0.1s is
    # not 0.1, and 1/epsilon turned that rounding into advantages of about -0.007.
    flat = _all_equal(scores.float(), stats.inverse, len(stats.mean)) & ~single
    adv_seq = torch.where(flat[stats.inverse], torch.zeros_like(adv_seq), adv_seq)
    keep_group = torch.ones_like(single)
    if std_threshold is not None:
        keep_group = ~single & (std > std_threshold)
    keep = keep_group[stats.inverse]  # [B]
    adv_seq = torch.where(keep, adv_seq, torch.zeros_like(adv_seq))
    advantages = adv_seq.unsqueeze(-1) * action_mask  # [B, T]
    metrics = summary("group_advantages/reward_mean", mean) | summary("group_advantages/reward_std", std)
    metrics["filtered_count"] = float((~keep).sum().item())
    return advantages, keep, metrics


def grpo(
    batch: TrainBatch,
    *,
    epsilon: float = 1e-6,
    std_threshold: float | None = None,
    std_cal_level: str = "group",
) -> AdvantageOutput:
    """Registry adapter: GRPO advantages of a TrainBatch (token_level_rewards filled by the caller)."""
    scores = sequence_scores(batch.require("token_level_rewards"))
    adv, keep, metrics = grpo_advantages(
        scores,
        batch.action_mask,
        batch.group_index,
        epsilon=epsilon,
        std_threshold=std_threshold,
        std_cal_level=std_cal_level,
    )
    return AdvantageOutput(adv, adv.clone(), metrics, keep if std_threshold is not None else None)
