"""KL estimators between the policy and the frozen reference, used as a reward penalty or a loss term.

Per-token estimators of KL(pi || pi_ref) from samples of pi, with d = logprob - ref_logprob
(Schulman, "Approximating KL divergence", 2020; names as Trinity-RFT / veRL):
    none        0
    k1          d
    k2          d^2 / 2
    k3          exp(-d) - 1 + d                      (unbiased, always >= 0)
    low_var_kl  clamp(exp(-d') - 1 + d', -10, 10),  d' = clamp(d, -20, 20)   (k3 clamped for stability)
    abs         |d|
    corrected_k3  clamp(exp(logprob - old_logprob), 0, 2) * k3     (k3 importance-corrected to the
                  behaviour policy, DeepSeek-V3.2; plain k3 when old_logprob is not given, e.g. as a
                  reward penalty, where the policy is the behaviour policy)

Coefficient: fixed kl_coef (Trinity default 0.001), or adaptive (Ziegler et al. 2019, arXiv:1909.08593):
    e = clip(kl / target_kl - 1, -0.2, 0.2);  kl_coef *= 1 + e * batch_size / horizon
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean
from services.common.errors import InvalidArgument
from services.trainer.algorithms.api import LossMetrics


def kl_none(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    return torch.zeros_like(logprob)


def kl_k1(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    return logprob - ref_logprob


def kl_k2(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    return 0.5 * (logprob - ref_logprob).square()


def kl_k3(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    log_r = ref_logprob - logprob
    return log_r.exp() - 1 - log_r


def kl_low_var(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    log_r = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(log_r.exp() - log_r - 1, min=-10, max=10)


def kl_abs(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    return (logprob - ref_logprob).abs()


def kl_corrected_k3(logprob: Tensor, ref_logprob: Tensor, old_logprob: Tensor | None = None) -> Tensor:
    k3 = kl_k3(logprob, ref_logprob)
    if old_logprob is None:
        return k3
    return torch.clamp(torch.exp(logprob - old_logprob), min=0.0, max=2.0) * k3


@dataclass
class KLTerm:
    """One KL use (penalty or loss): the estimator, and a fixed or adaptive coefficient (state)."""

    name: str
    estimator: Callable[..., Tensor]  # (logprob [B,T], ref_logprob [B,T][, old_logprob]) -> kl [B,T]
    kl_coef: float = 0.001
    adaptive: bool = False
    target_kl: float | None = None
    horizon: float | None = None
    config_key: str = "algorithm.kl_penalty_fn_args"
    takes_old_logprob: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.adaptive and (self.target_kl is None or self.horizon is None):
            raise InvalidArgument("adaptive KL needs target_kl and horizon", field=self.config_key)
        try:
            self.takes_old_logprob = "old_logprob" in inspect.signature(self.estimator).parameters
        except (TypeError, ValueError):
            self.takes_old_logprob = False

    @property
    def active(self) -> bool:
        """A KL term that changes something: an estimator and a nonzero coefficient (kl_coef 0 stays 0
        under the adaptive controller too), so a KL of 0 * kl needs no reference model."""
        return self.name != "none" and self.kl_coef != 0.0

    def update_coef(self, current_kl: float, batch_size: int) -> None:
        """Adaptive controller step (no-op when fixed)."""
        if self.adaptive:
            error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)  # type: ignore[operator]
            self.kl_coef *= 1.0 + error * batch_size / self.horizon  # type: ignore[operator]

    def apply_penalty(
        self, token_level_scores: Tensor, old_logprob: Tensor, ref_logprob: Tensor | None, mask: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        """token_level_rewards = scores - kl_coef * kl(old_logprob, ref) * mask; then adapt the coef.

        Metrics: kl (mean over sequences of the per-sequence token mean), kl_coef (the coef used).
        """
        if not self.active:
            return token_level_scores, {}
        if ref_logprob is None:
            raise InvalidArgument(
                "kl_penalty_fn needs ref_logprob from the reference model", field="batch.ref_logprob"
            )
        kl = self.estimator(old_logprob, ref_logprob) * mask  # [B, T]
        coef = self.kl_coef
        rewards = token_level_scores - coef * kl
        current = masked_mean(kl, mask, dim=-1).mean().item()
        self.update_coef(current, int(mask.shape[0]))
        return rewards, {"kl": current, "kl_coef": coef}

    def loss(
        self,
        logprob: Tensor,
        ref_logprob: Tensor | None,
        mask: Tensor,
        loss_agg_mode: str,
        old_logprob: Tensor | None = None,
    ) -> tuple[Tensor, LossMetrics]:
        """kl_coef * aggregate(kl(logprob, ref)); metrics kl_loss (unscaled) and kl_coef."""
        if not self.active:
            return logprob.sum() * 0.0, {}
        if ref_logprob is None:
            raise InvalidArgument(
                "kl_loss_fn needs ref_logprob from the reference model", field="batch.ref_logprob"
            )
        if self.takes_old_logprob:
            kl = self.estimator(logprob, ref_logprob, old_logprob=old_logprob)
        else:
            kl = self.estimator(logprob, ref_logprob)
        kl_loss = aggregate_loss(kl, mask, loss_agg_mode)
        return kl_loss * self.kl_coef, {"kl_loss": kl_loss.detach(), "kl_coef": self.kl_coef}
