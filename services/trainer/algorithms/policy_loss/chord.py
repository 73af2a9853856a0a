"""CHORD: SFT on expert rows weighted per token, mixed into GRPO/PPO with a scheduled coefficient.

With p_t = exp(logprob_t) and sg = stop-gradient:

    sft_is:    loss = agg( -logprob_t * sg(p_t) )                      (importance-weighted SFT)
    sft_phi:   loss = agg( -min(logprob_t, log cutoff_prob) * sg(phi(p_t)) ),  phi(p) = p * (1 - p)
               (phi down-weights tokens the model is already sure or hopeless about)
    agg: token mean (use_token_level_loss True, the default) or mean over rows of the row's token mean.

    mix_chord: loss = (1 - mu) * w_u * PPO(usual rows) + mu * w_e * SFT'(expert rows)
               SFT' = sft_phi when enable_phi_function (default) else plain sft; mu follows
               mu_schedule(step): linear warm-up 0 -> mu_peak over mu_warmup_steps, then cosine decay
               mu_peak -> mu_valley over mu_decay_steps, then mu_valley.
               w_u, w_e as in `mix` (each side a mean over its own rows of the whole batch; the builder
               passes them). step = 1 + the newest model_version in the micro-batch (the training step
               about to run in synchronous mode; Trinity passes its global step). The PPO part is reduced
               with grpo_loss_agg_mode, the SFT part with sft_loss_agg_mode (both token-mean; older
               names loss_agg_mode and use_token_level_loss_in_sft, as in `mix`).

Paper: Zhang et al., CHORD (arXiv:2508.11408). Trinity-RFT v0.5.2 names and defaults: mu_warmup_steps 0,
mu_decay_steps 0, mu_peak 0.1, mu_valley 0.1, enable_phi_function True, clip_range 0.2, cutoff_prob 1.0.
Trinity's batch-size arguments (use_dynamic_bsz, ppo_mini_batch_size, ppo_micro_batch_size_per_gpu,
ngpus_trainer, train_batch_size_usual, train_batch_size_expert) are accepted and unused: the weights come
from the real row counts of each batch, which is what those arguments approximate.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from services.algorithms.masked import aggregate_loss, masked_mean
from services.common.errors import InvalidArgument
from services.trainer.algorithms.policy_loss.adapter import batch_loss
from services.trainer.algorithms.policy_loss.mix import MIX_EXTRA_ARGS, mix_args
from services.trainer.algorithms.policy_loss.ppo import ppo_policy_loss


def _agg(per_token: Tensor, action_mask: Tensor, use_token_level_loss: bool) -> Tensor:
    if use_token_level_loss:
        return masked_mean(per_token, action_mask)
    return masked_mean(per_token, action_mask, dim=1).mean()


def sft_is_loss(
    logprob: Tensor, action_mask: Tensor, *, use_token_level_loss: bool = True
) -> tuple[Tensor, dict[str, float]]:
    loss = _agg(-logprob * torch.exp(logprob).detach(), action_mask, use_token_level_loss)
    return loss, {"sft_is_loss": loss.item()}


sft_is = batch_loss(sft_is_loss, name="sft_is")


def sft_phi_loss(
    logprob: Tensor, action_mask: Tensor, *, use_token_level_loss: bool = True, cutoff_prob: float = 1.0
) -> tuple[Tensor, dict[str, float]]:
    if not 0.0 <= cutoff_prob <= 1.0:
        raise InvalidArgument(
            f"cutoff_prob must be in [0, 1], got {cutoff_prob}",
            field="algorithm.policy_loss_fn_args.cutoff_prob",
        )
    prob = torch.exp(logprob)
    phi = (prob * (1.0 - prob)).detach()
    if cutoff_prob < 1.0:
        logprob = torch.clamp(logprob, max=math.log(cutoff_prob))
    loss = _agg(-logprob * phi, action_mask, use_token_level_loss)
    return loss, {"sft_phi_loss": loss.item()}


sft_phi = batch_loss(sft_phi_loss, name="sft_phi")


def mu_schedule(
    step: int, mu_warmup_steps: int, mu_decay_steps: int, mu_peak: float, mu_valley: float
) -> float:
    """CHORD's mu at `step`: linear warm-up, cosine decay, then the valley."""
    if step < mu_warmup_steps:
        return step / mu_warmup_steps * mu_peak
    if step >= mu_warmup_steps + mu_decay_steps:
        return mu_valley
    cosine = 0.5 * (1.0 + math.cos(math.pi * (step - mu_warmup_steps) / mu_decay_steps))
    return (mu_peak - mu_valley) * cosine + mu_valley


def mix_chord_policy_loss(
    logprob: Tensor,  # [B, T]
    old_logprob: Tensor,  # [B, T]
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    is_expert: Tensor,  # [B] bool
    model_version: Tensor,  # [B] long; step = 1 + the newest version (the step about to run)
    *,
    mu_warmup_steps: int = 0,
    mu_decay_steps: int = 0,
    mu_peak: float = 0.1,
    mu_valley: float = 0.1,
    enable_phi_function: bool = True,
    clip_range_low: float = 0.2,
    clip_range_high: float = 0.2,
    grpo_loss_agg_mode: str = "token-mean",
    sft_loss_agg_mode: str = "token-mean",
    usual_weight: float = 1.0,
    expert_weight: float = 1.0,
) -> tuple[Tensor, dict[str, float | Tensor]]:
    usual = ~is_expert
    step = int(model_version.max().item()) + 1 if model_version.numel() else 1
    mu = mu_schedule(step, mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley)
    zero = logprob.sum() * 0.0
    rl, sft = zero, zero
    metrics: dict[str, float | Tensor] = {}
    if usual.any():
        rl, rl_m = ppo_policy_loss(
            logprob[usual],
            old_logprob[usual],
            action_mask[usual],
            advantages[usual],
            clip_range_low=clip_range_low,
            clip_range_high=clip_range_high,
            loss_agg_mode=grpo_loss_agg_mode,
        )
        metrics |= {f"usual/{k}": v for k, v in rl_m.items()}
    if is_expert.any():
        lp, m = logprob[is_expert], action_mask[is_expert]
        if enable_phi_function:
            prob = torch.exp(lp)
            sft = aggregate_loss(-lp * (prob * (1.0 - prob)).detach(), m, sft_loss_agg_mode)
            metrics["expert/sft_phi_loss"] = sft.item()
        else:
            sft = aggregate_loss(-lp, m, sft_loss_agg_mode)
            metrics["expert/sft_loss"] = sft.item()
    loss = (1 - mu) * rl * usual_weight + mu * sft * expert_weight
    metrics |= {"loss": loss.item(), "mu": mu}
    return loss, metrics


mix_chord = batch_loss(
    mix_chord_policy_loss, name="mix_chord", extra_args=MIX_EXTRA_ARGS, prepare=mix_args("mix_chord")
)
