"""Rollout correction: importance weights and rejection masks from the trainer/engine logprob gap.

Every function takes log r = logprob_train - logprob_rollout per response token ([B, T]) and the
action mask; pi_train is the trainer's old policy (bypass off: recomputed before the update) or the
policy being trained (bypass on: old = rollout, so the gap is the current update's). Configured by
`algorithm.rollout_correction` (services/common/config/rollout_correction.py, veRL's schema).

Sources: veRL's rollout correction (verl/trainer/ppo/rollout_corr_helper.py, compute_policy_loss_
bypass_mode and compute_policy_loss_reinforce in verl/trainer/ppo/core_algos.py), as Trinity-RFT's
trainer calls it (trinity/trainer/verl/verl_trainer.py); Liu, Li et al., "When Speed Kills
Stability: Demystifying RL Collapse from the Training-Inference Mismatch" (2025). Metric names are
veRL's (`rollout_corr/...`, the prefix added by `RolloutCorrection`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean, masked_sum
from services.common.config.rollout_correction import Bounds, RolloutCorrectionConfig

SAFETY_BOUND = 20.0  # log-ratios are clamped to +-20 before exp (veRL's bound; exp(20) ~ 4.9e8)


def _rows_with_tokens(mask: Tensor) -> Tensor:
    return mask.sum(dim=-1) > 0  # [B] bool


def importance_weights(
    log_ratio: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    *,
    level: str,
    upper: float,
    lower: float | None = None,
    batch_normalize: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Detached importance weights [B, T] (0 on padding) and their metrics.

        token:    w_t = exp(clamp(log r_t, -20, 20))
        sequence: w_t = exp(clamp(sum_t m_t log r_t, -20, 20))  for every token t of the row
        truncated (TIS, lower None):    w <- min(w, upper)
        masked (IcePop, lower given):   w <- w if lower <= w <= upper else 0
        batch_normalize:                w <- w / mean(w)   (mean over tokens for token, over rows for
                                                            sequence; skipped when the mean is ~0)

    Metrics (veRL's names): rollout_is_mean (masked mean of w as applied, before normalising),
    rollout_is_max / rollout_is_min (raw weights over tokens, or over rows for sequence),
    rollout_is_ratio_fraction_high / _low (share of raw weights above upper / below lower, lower
    defaulting to 1/upper), rollout_is_eff_sample_size ((mean w)^2 / mean(w^2), 1 when every weight
    is equal), rollout_is_oob_ratio (masked only: share of tokens zeroed), rollout_is_batch_norm_factor.
    """
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
        units, unit_mask = raw, mask  # metrics over tokens
    elif level == "sequence":
        row_log = masked_sum(log_ratio, mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B]
        raw = torch.exp(row_log).unsqueeze(-1) * mask
        units, unit_mask = torch.exp(row_log), _rows_with_tokens(mask).to(log_ratio.dtype)
    else:
        raise ValueError(f"rollout_is must be token or sequence, got {level!r}")
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    weights = weights.detach()
    valid = unit_mask.bool()
    low = lower if lower is not None else 1.0 / upper
    mean_w = masked_mean(weights, mask)
    metrics = {
        "rollout_is_mean": mean_w.item(),
        "rollout_is_max": units[valid].max().item() if valid.any() else 0.0,
        "rollout_is_min": units[valid].min().item() if valid.any() else 0.0,
        "rollout_is_ratio_fraction_high": masked_mean((units > upper).float(), unit_mask).item(),
        "rollout_is_ratio_fraction_low": masked_mean((units < low).float(), unit_mask).item(),
        "rollout_is_eff_sample_size": (
            (mean_w**2 / masked_mean(weights**2, mask)).item() if mean_w > 0 else 0.0
        ),
    }
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).float(), mask).item()
    if batch_normalize:
        if level == "token":
            norm = mean_w
        else:
            norm = masked_mean(masked_mean(weights, mask, dim=-1), unit_mask)
        if norm > 1e-8:
            weights = weights / norm
        metrics["rollout_is_batch_norm_factor"] = norm.item() if norm > 1e-8 else 1.0
    return weights, metrics


def _row_max(values: Tensor, mask: Tensor) -> Tensor:
    """Max over each row's masked tokens ([B]); 0 for a row with none."""
    filled = values.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(filled), torch.zeros_like(filled), filled)


def rejection_mask(
    log_ratio: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    bounds: dict[str, Bounds],
) -> tuple[Tensor, dict[str, float]]:
    """keep [B, T] in {0, 1}: 1 where every option in `bounds` passes; and the rejection metrics.

    With log r clamped to +-20:  k1 = -log r,  k2 = (log r)^2 / 2,  k3 = exp(log r) - 1 - log r.
        token_kX:    the token's statistic               (a failing token is dropped)
        seq_sum_kX:  sum over the row's tokens            (a failing row is dropped whole)
        seq_mean_kX: mean over the row's tokens
        seq_max_kX:  max over the row's tokens
    k1 options bound a ratio: keep lower <= exp(-stat) <= upper, i.e. r_t (token), prod_t r_t (seq_sum)
    or the geometric mean of r (seq_mean) in [lower, upper]. (veRL's documented meaning; its code
    compares -log r with [log lower, log upper], i.e. bounds 1/r: the same for bounds [1/u, u].)
    k2 / k3 options: keep stat <= upper.

    Metrics (veRL's names): rollout_rs_masked_fraction (share of tokens dropped),
    rollout_rs_seq_masked_fraction (share of rows that lost a token), and per option
    rollout_rs_<option>_masked_fraction and rollout_rs_<option>_mean (masked mean of the statistic).
    """
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    token_stat = {"k1": -safe, "k2": 0.5 * safe**2, "k3": torch.exp(safe) - 1.0 - safe}
    keep = torch.ones_like(mask)
    metrics: dict[str, float] = {}
    for option, (lower, upper) in bounds.items():
        level, kind = option.rsplit("_", 1)
        stat = token_stat[kind]
        if level == "seq_sum":
            stat = masked_sum(stat, mask, dim=-1).unsqueeze(-1).expand_as(mask)
        elif level == "seq_mean":
            stat = masked_mean(stat, mask, dim=-1).unsqueeze(-1).expand_as(mask)
        elif level == "seq_max":
            stat = _row_max(stat, mask).unsqueeze(-1).expand_as(mask)
        if kind == "k1":
            assert lower is not None, option
            ratio = torch.exp(-stat)
            passed = (ratio >= lower) & (ratio <= upper)
        else:
            passed = stat <= upper
        option_keep = passed.to(mask.dtype)
        keep = keep * option_keep
        metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean(1.0 - option_keep, mask).item()
        metrics[f"rollout_rs_{option}_mean"] = masked_mean(stat, mask).item()
    dropped = (1.0 - keep) * mask
    metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep, mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = (dropped.sum(dim=-1) > 0).float().mean().item()
    return keep, metrics


def off_policy_metrics(train_logprob: Tensor, rollout_logprob: Tensor, mask: Tensor) -> dict[str, float]:
    """The gap between the two policies, veRL's diagnostics (r = pi_train / pi_rollout):

    kl = mean_t (log pi_rollout - log pi_train)        (KL(rollout || train), direct estimator)
    k3_kl = mean_t (r - log r - 1)
    chi2_token = mean_t r^2 - 1;   chi2_seq = mean_rows (prod_t r_t)^2 - 1   (log r clamped to +-20)
    log_ppl_diff = mean_rows (mean_t log pi_rollout - mean_t log pi_train)
    """
    log_ratio = train_logprob - rollout_logprob
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    rows = _rows_with_tokens(mask)
    row_sum = masked_sum(log_ratio, mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    ppl_diff = masked_mean(rollout_logprob, mask, dim=-1) - masked_mean(train_logprob, mask, dim=-1)
    return {
        "kl": masked_mean(-log_ratio, mask).item(),
        "k3_kl": masked_mean(torch.exp(safe) - safe - 1.0, mask).item(),
        "chi2_token": (masked_mean(torch.exp(safe) ** 2, mask) - 1.0).item(),
        "chi2_seq": (torch.exp(2.0 * row_sum[rows]).mean() - 1.0).item() if rows.any() else 0.0,
        "log_ppl_diff": ppl_diff[rows].mean().item() if rows.any() else 0.0,
    }


def reinforce_is_loss(
    logprob: Tensor,  # [B, T] current policy, carries grad
    rollout_logprob: Tensor,  # [B, T] (= old_logprob in bypass mode)
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    weights: Tensor | None,  # [B, T] detached IS weights, or None
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """veRL's bypass-mode loss_type reinforce: loss_t = -A_t * w_t * logprob_t (w = 1 without rollout_is),
    aggregated with loss_agg_mode; no clipping. Metrics: pg_loss, ppo_kl = mean_t (rollout - logprob)."""
    coef = advantages if weights is None else advantages * weights
    loss = aggregate_loss(-coef * logprob, action_mask, loss_agg_mode)
    ppo_kl = masked_mean(rollout_logprob - logprob.detach(), action_mask)
    return loss, {"pg_loss": loss.item(), "ppo_kl": ppo_kl.item()}


@dataclass(frozen=True)
class RolloutCorrection:
    """One configured correction: `(train, rollout, mask) -> (weights or None, keep, metrics)`."""

    level: str | None
    is_bounds: Bounds
    batch_normalize: bool
    rs_bounds: dict[str, Bounds]

    @classmethod
    def from_config(cls, cfg: RolloutCorrectionConfig) -> RolloutCorrection:
        return cls(cfg.rollout_is, cfg.is_bounds, cfg.rollout_is_batch_normalize, cfg.rs_bounds)

    @torch.no_grad()
    def __call__(
        self, train_logprob: Tensor, rollout_logprob: Tensor, mask: Tensor
    ) -> tuple[Tensor | None, Tensor, dict[str, float]]:
        """Weights [B, T] (None when rollout_is is null), keep mask [B, T], metrics `rollout_corr/*`."""
        log_ratio = train_logprob - rollout_logprob
        metrics = off_policy_metrics(train_logprob, rollout_logprob, mask)
        weights = None
        if self.level is not None:
            weights, is_metrics = importance_weights(
                log_ratio,
                mask,
                level=self.level,
                upper=self.is_bounds.upper,
                lower=self.is_bounds.lower,
                batch_normalize=self.batch_normalize,
            )
            metrics |= is_metrics
        keep = torch.ones_like(mask)
        if self.rs_bounds:
            keep, rs_metrics = rejection_mask(log_ratio, mask, self.rs_bounds)
            metrics |= rs_metrics
        return weights, keep, {f"rollout_corr/{k}": v for k, v in metrics.items()}
