"""Advantage fns driven by a signal beyond the reward: teacher logprobs, run/step ids, baselines.

Each is a pure tensor function (tested by hand) plus a registry adapter. on_policy_distill and jsd
read `teacher_logprobs` (filled by the on-policy distillation workflows); step_wise_grpo reads the
run and step ids (and normally arrives computed by the explorer); clipb reads the current model's
entropy, which the trainer computes for it. remax and clipv still fail at the first batch with
InvalidArgument naming the signal the rows lack (nothing fills ReMax's greedy-baseline reward, in
Trinity either; clipv's per-token "necs" has no definition we can reproduce), so a Trinity config
naming them is accepted by the schema but never trains on wrong numbers.

    remax:              returns_t = sum_{t'>=t} r_t' * m;   A_t = returns_t - b * m_t
                        b = the reward of the greedy rollout of the same prompt ("reward_baselines";
                        ReMax, Li et al. arXiv:2310.10505). Missing: the explorer does not roll out a
                        greedy baseline per task.
    on_policy_distill:  A_t = kl_coef * (teacher_logprob_t - old_logprob_t) * m_t   (default kl_coef 1.0;
                        Tinker's on-policy distillation). Reads teacher_logprobs.
    jsd:                A_t = -kl_coef * JSD_t * m_t on the sampled token, with p_s = exp(old_logprob),
                        p_t = exp(teacher_logprob), M = lambda * p_t + (1 - lambda) * p_s and
                        JSD_t = lambda * p_t * log(p_t / M) + (1 - lambda) * p_s * log(p_s / M)
                        (0 when lambda is 0 or 1; Trinity's kl_coef 1.0, lambda_coef 0.5).
                        Reads teacher_logprobs.
    step_wise_grpo:     multi_step_grpo: GRPO over the final step's reward of each run, broadcast to every
                        step of that run (step_wise.py, tested). Reads run / step ids.
    clipb, clipv:       GRPO plus entropy-driven token masks (entropy_clip.py, tested). clipb reads the
                        current model's entropy (batch.entropy); clipv's necs is missing.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from services.algorithms.advantage.base import AdvantageOutput
from services.algorithms.advantage.entropy_clip import clipb_keep
from services.algorithms.advantage.grpo import grpo
from services.algorithms.advantage.step_wise import step_wise_grpo_advantages
from services.algorithms.batch import TrainBatch
from services.common.errors import InvalidArgument


def remax_advantages(
    token_level_rewards: Tensor, reward_baselines: Tensor, action_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """token_level_rewards [B, T], reward_baselines [B], action_mask [B, T] -> (advantages, returns)."""
    returns = (token_level_rewards * action_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * action_mask
    return advantages, returns


def on_policy_distill_advantages(
    teacher_logprob: Tensor, old_logprob: Tensor, action_mask: Tensor, *, kl_coef: float = 1.0
) -> Tensor:
    """teacher_logprob, old_logprob, action_mask [B, T] -> advantages [B, T] (reverse-KL reward)."""
    return kl_coef * (teacher_logprob - old_logprob) * action_mask


def jsd_advantages(
    teacher_logprob: Tensor,
    old_logprob: Tensor,
    action_mask: Tensor,
    *,
    kl_coef: float = 1.0,
    lambda_coef: float = 0.5,
) -> Tensor:
    """teacher_logprob, old_logprob, action_mask [B, T] -> advantages [B, T] (minus the per-token JSD)."""
    if lambda_coef <= 0.0 or lambda_coef >= 1.0:
        return torch.zeros_like(old_logprob)
    log_mix = torch.logsumexp(
        torch.stack([old_logprob + math.log(1.0 - lambda_coef), teacher_logprob + math.log(lambda_coef)]),
        dim=0,
    )
    kl_teacher = teacher_logprob.exp() * (teacher_logprob - log_mix)
    kl_student = old_logprob.exp() * (old_logprob - log_mix)
    jsd = lambda_coef * kl_teacher + (1.0 - lambda_coef) * kl_student
    return -kl_coef * jsd * action_mask


def _missing(name: str, what: str) -> InvalidArgument:
    return InvalidArgument(
        f"advantage_fn {name!r} needs {what}, which this trainer's experience rows do not carry;"
        " choose another advantage_fn (e.g. grpo), or have the workflow fill Experience.advantages"
        " (rows that carry advantages skip this step)",
        field="algorithm.advantage_fn",
    )


def remax(batch: TrainBatch) -> AdvantageOutput:
    raise _missing("remax", "reward_baselines (the greedy rollout's reward per task)")


def _teacher(batch: TrainBatch, name: str) -> Tensor:
    if batch.teacher_logprob is None:
        raise _missing(
            name,
            "teacher_logprobs per response token (use on_policy_distill_workflow or "
            "on_policy_distill_math_workflow, which score each rollout with the first auxiliary model)",
        )
    return batch.teacher_logprob


def _signal_output(advantages: Tensor, metrics: dict[str, float]) -> AdvantageOutput:
    return AdvantageOutput(advantages, advantages.clone(), metrics)


def on_policy_distill(batch: TrainBatch, *, kl_coef: float = 1.0) -> AdvantageOutput:
    teacher = _teacher(batch, "on_policy_distill")
    adv = on_policy_distill_advantages(teacher, batch.old_logprob, batch.action_mask, kl_coef=kl_coef)
    kl = ((batch.old_logprob - teacher) * batch.action_mask).sum(dim=-1)  # per row (Trinity's metrics)
    return _signal_output(
        adv,
        {
            "kl/mean": kl.mean().item(),
            "kl/std": kl.std().item() if kl.numel() > 1 else 0.0,
            "advantages/mean": adv.sum(dim=-1).mean().item(),
        },
    )


def jsd(batch: TrainBatch, *, kl_coef: float = 1.0, lambda_coef: float = 0.5) -> AdvantageOutput:
    teacher = _teacher(batch, "jsd")
    adv = jsd_advantages(
        teacher, batch.old_logprob, batch.action_mask, kl_coef=kl_coef, lambda_coef=lambda_coef
    )
    return _signal_output(adv, _masked_mean("jsd", -adv / kl_coef if kl_coef else adv, batch.action_mask))


def _masked_mean(name: str, values: Tensor, mask: Tensor) -> dict[str, float]:
    total = mask.sum()
    return {f"{name}/mean": float((values * mask).sum() / total) if total > 0 else 0.0}


def step_wise_grpo(
    batch: TrainBatch,
    *,
    epsilon: float = 1e-6,
    enable_step_norm: bool = False,
    std_cal_level: str = "group",
    std_threshold: float | None = None,
) -> AdvantageOutput:
    """Normally computed by the explorer (rows arrive with advantages and skip this step); rows
    written without them (an external agent) are scored here from their run and step ids, which is
    exact when every run of a task is in the batch."""
    if batch.run_index is None or batch.step_index is None:
        raise _missing("step_wise_grpo", "the run id and step index of each row (multi-step experience)")
    adv, keep = step_wise_grpo_advantages(
        batch.rewards,
        batch.action_mask,
        batch.group_index,
        batch.run_index,
        batch.step_index,
        epsilon=epsilon,
        enable_step_norm=enable_step_norm,
        std_cal_level=std_cal_level,
        std_threshold=std_threshold,
    )
    return AdvantageOutput(adv, adv.clone(), {"filtered_count": float((~keep).sum())}, keep)


def clipb(batch: TrainBatch, *, epsilon: float = 1e-6, mu: float = 2.5) -> AdvantageOutput:
    """GRPO advantages with entropy_clip.clipb_keep's token mask; the entropy is the current
    model's (batch.entropy, filled by the trainer before the advantage step)."""
    if batch.entropy is None:
        raise _missing("clipb", "per-token entropy of the current model at advantage time")
    out = grpo(batch, epsilon=epsilon)
    keep = clipb_keep(out.advantages, batch.old_logprob, batch.entropy, batch.action_mask, mu=mu)
    kept = out.advantages * keep
    dropped = float(((batch.action_mask > 0) & (keep == 0)).sum())
    total = float(batch.action_mask.sum().clamp_min(1.0))
    return AdvantageOutput(
        kept, kept.clone(), {**out.metrics, "clipb/dropped_frac": dropped / total}, out.keep
    )


def clipv(
    batch: TrainBatch, *, epsilon: float = 1e-6, mu: float = 8.5, max_frac: float = 1e-4
) -> AdvantageOutput:
    """The token mask is entropy_clip.clipv_keep; needs current-model entropy and per-token necs."""
    raise _missing("clipv", "per-token entropy of the current model and necs at advantage time")
