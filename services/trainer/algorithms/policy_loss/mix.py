"""MIX: PPO/GRPO on the explorer's rows plus SFT on expert rows, in one loss.

    loss = (1 - mu) * w_u * PPO(usual rows) + mu * w_e * SFT(expert rows)

w_u = n_usual_in_micro_batch / N_usual_in_batch (and w_e likewise), so that summed over the
micro-batches each term is a proper mean over its own rows whatever the mix inside a micro-batch
(Trinity-RFT's per_micro_batch_weight_* with its read_batch_size_usual/expert). The caller passes
w_u, w_e already divided by the loop's loss_scale.

Aggregation as Trinity-RFT v0.5.2: the PPO part uses grpo_loss_agg_mode and the SFT part
sft_loss_agg_mode, both token-mean by default (before Trinity's #294 the SFT part was a sequence mean).
grpo_loss_agg_mode wins over loss_agg_mode (the algorithm-wide setting); use_token_level_loss_in_sft
(older name) sets sft_loss_agg_mode to token-mean (True) or seq-mean-token-mean (False).
Trinity's batch-size arguments (use_dynamic_bsz, ppo_mini_batch_size, ppo_micro_batch_size_per_gpu,
ngpus_trainer, train_batch_size_usual, train_batch_size_expert) are accepted and unused: w_u and w_e
come from the real row counts of each batch, which those arguments approximate.

Metrics: usual/<ppo metrics>, expert/sft_loss, loss. Paper: Trinity-RFT's MIX (SFT + RL,
arXiv:2505.17826; cf. LUFFY arXiv:2504.14945). Defaults mu 0.1, clip_range 0.2.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from services.algorithms.batch import TrainBatch
from services.algorithms.masked import aggregate_loss, check_loss_agg_mode
from services.common.errors import InvalidArgument
from services.trainer.algorithms.policy_loss.adapter import Prepare, batch_loss
from services.trainer.algorithms.policy_loss.ppo import clip_args, ppo_policy_loss


def mix_policy_loss(
    logprob: Tensor,  # [B, T]
    old_logprob: Tensor,  # [B, T]
    action_mask: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    is_expert: Tensor,  # [B] bool
    *,
    mu: float = 0.1,
    usual_weight: float = 1.0,
    expert_weight: float = 1.0,
    clip_range_low: float = 0.2,
    clip_range_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    grpo_loss_agg_mode: str = "token-mean",
    sft_loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float | Tensor]]:
    usual = ~is_expert
    metrics: dict[str, float | Tensor] = {}
    zero = logprob.sum() * 0.0  # keeps the graph alive when one side is empty
    rl = zero
    if usual.any():
        rl, rl_metrics = ppo_policy_loss(
            logprob[usual],
            old_logprob[usual],
            action_mask[usual],
            advantages[usual],
            clip_range_low=clip_range_low,
            clip_range_high=clip_range_high,
            clip_ratio_c=clip_ratio_c,
            loss_agg_mode=grpo_loss_agg_mode,
        )
        metrics |= {f"usual/{k}": v for k, v in rl_metrics.items()}
    sft = zero
    if is_expert.any():
        sft = aggregate_loss(-logprob[is_expert], action_mask[is_expert], sft_loss_agg_mode)
        metrics["expert/sft_loss"] = sft.item()
    loss = (1 - mu) * rl * usual_weight + mu * sft * expert_weight
    metrics["loss"] = loss.item()
    return loss, metrics


# Trinity v0.5.2's batch-size arguments: accepted so its configs load, unused (see the docstring).
TRINITY_BATCH_SIZE_ARGS = (
    "use_dynamic_bsz",
    "ppo_mini_batch_size",
    "ppo_micro_batch_size_per_gpu",
    "ngpus_trainer",
    "train_batch_size_usual",
    "train_batch_size_expert",
)
# Config names that are not the tensor function's own: Trinity's single clip bound, the older names
# of the two aggregation modes, and the batch-size arguments.
MIX_EXTRA_ARGS = ("clip_range", "loss_agg_mode", "use_token_level_loss_in_sft", *TRINITY_BATCH_SIZE_ARGS)


def mix_args(name: str) -> Prepare:
    """`prepare` of mix and mix_chord: expert rows must be marked; aliases become the loss's own args."""

    def prepare(batch: TrainBatch, args: dict[str, Any]) -> dict[str, Any]:
        if batch.is_expert is None:
            raise InvalidArgument(
                f"policy_loss_fn {name!r} needs batch.is_expert (use sample_strategy 'mix')",
                field="batch.is_expert",
            )
        for arg in TRINITY_BATCH_SIZE_ARGS:
            args.pop(arg, None)
        return agg_mode_args(clip_args(batch, args))

    return prepare


def agg_mode_args(args: dict[str, Any]) -> dict[str, Any]:
    """grpo_loss_agg_mode / sft_loss_agg_mode from the v0.5.2 names and their older aliases.

    loss_agg_mode (the algorithm-wide setting) applies to the PPO part unless grpo_loss_agg_mode is
    given; use_token_level_loss_in_sft sets sft_loss_agg_mode (True token-mean, False
    seq-mean-token-mean). A mode left unset keeps the loss's default.
    """
    key = "algorithm.policy_loss_fn_args"
    loss_agg_mode = args.pop("loss_agg_mode", None)
    token_level = args.pop("use_token_level_loss_in_sft", None)
    if token_level is not None:
        if args.get("sft_loss_agg_mode") is not None:
            raise InvalidArgument(
                "sft_loss_agg_mode and use_token_level_loss_in_sft name the same setting; give one", field=key
            )
        args["sft_loss_agg_mode"] = "token-mean" if token_level else "seq-mean-token-mean"
    if args.get("grpo_loss_agg_mode") is None and loss_agg_mode is not None:
        args["grpo_loss_agg_mode"] = loss_agg_mode
    for mode in ("grpo_loss_agg_mode", "sft_loss_agg_mode"):
        if args.get(mode) is None:
            args.pop(mode, None)
        else:
            check_loss_agg_mode(args[mode], f"{key}.{mode}")
    return args


mix = batch_loss(mix_policy_loss, name="mix", extra_args=MIX_EXTRA_ARGS, prepare=mix_args("mix"))
