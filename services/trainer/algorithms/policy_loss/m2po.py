"""M2PO: second-moment trust policy optimisation, for training on stale rollouts.

Mask, once per optimizer step over the whole batch, from the current policy before the update
(`m2po_prepass`; the engine runs one forward without grad for it), stored as batch.m2po_mask:

    log r_t = logprob_t - old_logprob_t          (old = the rollout policy: bypass_old_logprobs true)
    T       = {t : m_t = 1 and ((A_t > 0 and log r_t > 0) or (A_t < 0 and log r_t < 0))}
              (the tokens where PPO's clip would be active)
    M2(S)   = mean_{t in S} (log r_t)^2
    drop the tokens of T with the largest (log r)^2, one at a time, until M2(T's kept tokens) <= tau
    (tau = m2_threshold); tokens outside T are never dropped.

    Vectorised: T's values sorted ascending v_1 <= ... <= v_n have non-decreasing prefix means p_k,
    so the loop keeps exactly the k tokens with p_k <= tau (the smallest ones).

Loss, per micro-batch:

    ratio_t = exp(clamp(log r_t, -c, c)), c = log_ratio_clip, with straight-through gradient
              (forward value at the clamped log-ratio, gradient d exp(log r) at that value)
    loss_t  = -A_t * ratio_t * M_t            (M = m2po_mask, a constant)
    pg_loss = sum_t m_t loss_t / sum_t m_t    (every valid token in the denominator, masked ones
                                               included: the paper's footnote 2; token-mean only)

Metrics (Trinity's names): pg_loss, ppo_kl = mean_t(-log ratio_t), ratio/mean; from the mask:
m2_before, m2_after (M2 of T before / after dropping), masked_fraction (dropped / valid tokens),
trust_region_fraction (|T| / valid tokens), reported as actor/m2po/<name>.

Paper: Zheng et al., "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on
LLMs?" (M2PO, arXiv:2510.01161). Trinity-RFT v0.6: trinity/algorithm/policy_loss_fn/m2po_policy_loss.py
(defaults m2_threshold 0.04, log_ratio_clip 20.0, loss_agg_mode token-mean, required).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from services.algorithms.batch import TrainBatch
from services.algorithms.masked import masked_mean
from services.common.errors import InvalidArgument
from services.trainer.algorithms.policy_loss.adapter import batch_loss

M2_THRESHOLD = 0.04  # the paper's tau, Trinity's default
FIELD = "algorithm.policy_loss_fn_args"


def check_m2po_args(m2_threshold: float, log_ratio_clip: float, loss_agg_mode: str) -> None:
    """Trinity's argument checks, run when the algorithm is built and at every call."""
    if not math.isfinite(m2_threshold) or m2_threshold < 0:
        raise InvalidArgument(f"m2_threshold must be finite and >= 0, got {m2_threshold}", field=FIELD)
    if not math.isfinite(log_ratio_clip) or log_ratio_clip <= 0:
        raise InvalidArgument(f"log_ratio_clip must be finite and > 0, got {log_ratio_clip}", field=FIELD)
    if loss_agg_mode != "token-mean":
        raise InvalidArgument(
            f"m2po needs loss_agg_mode token-mean (the paper's valid-token denominator), got {loss_agg_mode!r}",
            field=f"{FIELD}.loss_agg_mode",
        )


def _finite(log_ratio: Tensor, action_mask: Tensor) -> None:
    if not bool(torch.isfinite(log_ratio[action_mask.bool()]).all()):
        raise InvalidArgument(
            "m2po: non-finite log-probability ratio in the batch", field="batch.old_logprob"
        )


def m2po_mask(
    log_ratio: Tensor,  # [B, T] current - behaviour, over the whole optimizer batch
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    m2_threshold: float = M2_THRESHOLD,
) -> tuple[Tensor, dict[str, float]]:
    """The M2PO token mask [B, T] (float, 1 = kept; 0 on padding) and its metrics (module docstring)."""
    _finite(log_ratio, action_mask)
    valid = action_mask.bool()
    log_ratio, advantages = log_ratio.detach(), advantages.detach()
    trust = valid & (((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0)))
    index = trust.reshape(-1).nonzero(as_tuple=True)[0]  # flat positions of T
    values = log_ratio.float().square().reshape(-1)[index]
    keep_trust = torch.ones_like(values, dtype=torch.bool)
    m2_before = values.mean().item() if values.numel() else 0.0
    if values.numel() and m2_before > m2_threshold:
        ordered, order = torch.sort(values, stable=True)
        prefix_means = ordered.cumsum(0) / torch.arange(1, len(ordered) + 1, device=ordered.device)
        kept = int((prefix_means <= m2_threshold).sum().item())
        keep_trust[order[kept:]] = False
    mask = valid.clone().reshape(-1)
    mask[index[~keep_trust]] = False
    n_valid = max(int(valid.sum().item()), 1)
    return mask.view_as(valid).to(action_mask.dtype), {
        "m2_before": m2_before,
        "m2_after": values[keep_trust].mean().item() if bool(keep_trust.any()) else 0.0,
        "masked_fraction": int((~keep_trust).sum().item()) / n_valid,
        "trust_region_fraction": values.numel() / n_valid,
    }


def m2po_policy_loss(
    logprob: Tensor,  # [B, T] current policy, carries grad
    old_logprob: Tensor,  # [B, T] behaviour (rollout) policy
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    m2po_mask: Tensor,  # [B, T] from m2po_prepass, a constant
    *,
    m2_threshold: float = M2_THRESHOLD,
    log_ratio_clip: float = 20.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    check_m2po_args(m2_threshold, log_ratio_clip, loss_agg_mode)
    log_ratio = logprob - old_logprob
    _finite(log_ratio.detach(), action_mask)
    clamped = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    stable = log_ratio + (clamped - log_ratio).detach()  # value clamped, gradient of log_ratio
    ratio = torch.exp(stable)
    kept = m2po_mask * action_mask  # a rejection mask applied after the prepass narrows it further
    pg_loss = (-advantages * ratio * kept).sum() / (action_mask.sum() + 1e-8)
    return pg_loss, {
        "pg_loss": pg_loss.item(),
        "ppo_kl": masked_mean(-stable.detach(), action_mask).item(),
        "ratio/mean": masked_mean(ratio.detach(), action_mask).item(),
    }


def m2po_prepass(batch: TrainBatch, logprob: Tensor, args: dict[str, Any]) -> dict[str, float]:
    """Set batch.m2po_mask from the current policy's logprob [B, T] (no grad) over the whole batch;
    the mask's metrics back, named m2po/<name>."""
    log_ratio = logprob - batch.old_logprob
    mask, metrics = m2po_mask(
        log_ratio, batch.action_mask, batch.require("advantages"), args.get("m2_threshold", M2_THRESHOLD)
    )
    batch.m2po_mask = mask
    return {f"m2po/{k}": v for k, v in metrics.items()}


m2po = batch_loss(m2po_policy_loss, name="m2po", prepass=m2po_prepass, check=check_m2po_args)
