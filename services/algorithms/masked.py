"""Masked reductions and loss aggregation shared by every part.

Definitions follow Trinity-RFT's trinity/algorithm/utils.py (itself from veRL's torch_functional):
the 1e-8 in masked_mean and whitening, Bessel's correction in masked_var, and the four
loss_agg_mode reductions, so the same inputs give the same numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from services.common.errors import InvalidArgument

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(values * mask) over `dim` (all elements when None)."""
    return (values * mask).sum() if dim is None else (values * mask).sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(values * mask) / (sum(mask) + 1e-8); an all-zero mask gives 0, not NaN."""
    return masked_sum(values, mask, dim) / (masked_sum(torch.ones_like(values), mask, dim) + 1e-8)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked elements, with Bessel's correction n/(n-1) when unbiased (n >= 2)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n < 2:
            raise InvalidArgument(
                f"whitening needs at least 2 unmasked tokens, got {int(n.item())}", field="batch.action_mask"
            )
        var = var * n / (n - 1)
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(values - mean) / sqrt(var + 1e-8) over the masked elements (mean re-added if not shift_mean)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def aggregate_loss(
    values: Tensor, mask: Tensor, loss_agg_mode: str = "token-mean", normalizer: float | None = None
) -> Tensor:
    """Reduce per-token losses values[B, T] under mask[B, T] to a scalar.

    token-mean:              sum(v*m) / sum(m)                  (every token weighs the same; DAPO)
    seq-mean-token-sum:      mean_b sum_t v*m                   (Dr. GRPO-style, long answers weigh more)
    seq-mean-token-mean:     mean_b (sum_t v*m / sum_t m)        (original GRPO paper)
    seq-mean-token-sum-norm: sum(v*m) / normalizer, normalizer = T (mask.shape[-1]) by default (Dr. GRPO)
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(values, mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_sum(values, mask, dim=-1).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return masked_mean(values, mask, dim=-1).mean()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        norm = normalizer if normalizer is not None else mask.shape[-1]
        return masked_sum(values, mask) / norm
    raise InvalidArgument(
        f"unknown loss_agg_mode {loss_agg_mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}",
        field="algorithm.loss_agg_mode",
    )


def check_loss_agg_mode(mode: str, field: str) -> str:
    if mode not in LOSS_AGG_MODES:
        raise InvalidArgument(
            f"unknown loss_agg_mode {mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}", field=field
        )
    return mode
