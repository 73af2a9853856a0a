"""Entropy bonus: the loop subtracts entropy_coef * aggregate(entropy) from the loss.

    default: term = entropy_coef * aggregate(H, mask, loss_agg_mode)     (Trinity default entropy_coef 0.0)
    mix:     same, over the non-expert rows only (expert rows are SFT targets, not explored)
    none:    0
Metric: entropy_loss (the aggregated entropy, unscaled). Entropy regularisation: Williams & Peng 1991;
Mnih et al. A3C (arXiv:1602.01783).
"""

from __future__ import annotations

from torch import Tensor

from services.algorithms.batch import TrainBatch
from services.algorithms.masked import aggregate_loss
from services.trainer.algorithms.api import LossMetrics


def default(
    batch: TrainBatch, entropy: Tensor | None, *, entropy_coef: float = 0.0, loss_agg_mode: str = "token-mean"
) -> tuple[Tensor | float, LossMetrics]:
    """Returns (entropy_coef * aggregated entropy, metrics). Subtract it from the loss."""
    if entropy is None:
        return 0.0, {}
    value = aggregate_loss(entropy, batch.action_mask, loss_agg_mode)
    return value * entropy_coef, {"entropy_loss": value.detach()}


def mix(
    batch: TrainBatch, entropy: Tensor | None, *, entropy_coef: float = 0.0, loss_agg_mode: str = "token-mean"
) -> tuple[Tensor | float, LossMetrics]:
    if entropy is None or batch.is_expert is None:
        return default(batch, entropy, entropy_coef=entropy_coef, loss_agg_mode=loss_agg_mode)
    usual = ~batch.is_expert.bool()
    if not usual.any():
        return 0.0, {}
    value = aggregate_loss(entropy[usual], batch.action_mask[usual], loss_agg_mode)
    return value * entropy_coef, {"entropy_loss": value.detach()}


def none(batch: TrainBatch, entropy: Tensor | None) -> tuple[float, LossMetrics]:
    return 0.0, {}
