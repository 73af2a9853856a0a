"""Clip_B and Clip_V: GRPO advantages plus token masks driven by each token's entropy signal.

From "On the Entropy Dynamics in Reinforcement Fine-Tuning of LLMs" (arXiv:2602.03392), as Trinity-RFT
v0.5.2's clipb / clipv advantage fns. With p = exp(logprob), H = the policy's entropy at the token
(recomputed by the current model, not the sampler's) and masked mean / population std over the batch:

    S_t = p_t * (H_t + logprob_t)                       (the token's contribution to the entropy change)
    clipb: keep every token with A >= 0; a token with A < 0 is kept iff S_t - mean(S) >= -mu * std(S)
           (defaults epsilon 1e-6, mu 2.5)
    clipv: D_t = N_t - S_t (N_t: Trinity's "necs" per token); tokens with A > 0 kept, the others iff
           D_t <= mu * std(D); when more than max_frac of the tokens would go, only the
           max(int(max_frac * n), 1) negative-advantage tokens of largest D are dropped
           (defaults epsilon 1e-6, mu 8.5, max_frac 1e-4)
    std(S or D) < 1e-12: every token kept.

The advantages themselves are GRPO's (epsilon as in grpo). The clipb adapter (external_signal.py)
reads the entropy the trainer computes with the current model before the update; clipv's adapter
refuses to run: nothing here computes Trinity's necs.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _masked_mean_std(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    n = mask.sum().clamp_min(1.0)
    mean = (x * mask).sum() / n
    return mean, (((x - mean) ** 2 * mask).sum() / n).sqrt()


def clipb_keep(
    advantages: Tensor, logprob: Tensor, entropy: Tensor, action_mask: Tensor, *, mu: float = 2.5
) -> Tensor:
    """advantages, logprob, entropy, action_mask [B, T] -> keep [B, T] float (1 = token stays in the loss)."""
    signal = (logprob.exp() * (entropy + logprob)).detach().float()
    mean, std = _masked_mean_std(signal, action_mask.float())
    if std.item() < 1e-12:
        return torch.ones_like(action_mask)
    keep = torch.where(
        advantages < 0, signal - mean >= -mu * std, torch.ones_like(advantages, dtype=torch.bool)
    )
    return keep.to(action_mask.dtype)


def clipv_keep(
    advantages: Tensor,
    logprob: Tensor,
    entropy: Tensor,
    necs: Tensor,
    action_mask: Tensor,
    *,
    mu: float = 8.5,
    max_frac: float = 1e-4,
) -> Tensor:
    """advantages, logprob, entropy, necs, action_mask [B, T] -> keep [B, T] float."""
    m = action_mask.float()
    d = (necs - logprob.exp() * (entropy + logprob)).detach().float()
    _, std = _masked_mean_std(d, m)
    if std.item() < 1e-12:
        return torch.ones_like(action_mask)
    keep_neg = d <= mu * std
    keep = torch.where(advantages > 0, torch.ones_like(keep_neg), keep_neg)
    total = m.sum().clamp_min(1.0)
    if ((m > 0) & ~keep).float().sum() / total <= max_frac:
        return keep.to(action_mask.dtype)
    budget = max(int(max_frac * total.item()), 1)
    candidates = (advantages < 0) & (m > 0) & ~keep_neg
    if int(candidates.sum()) <= budget:
        return keep.to(action_mask.dtype)
    worst = torch.topk(d.masked_fill(~candidates, float("-inf")).view(-1), budget).indices
    limited = keep.clone()
    limited[candidates] = True
    limited.view(-1)[worst] = False
    return limited.to(action_mask.dtype)
