"""The batch every algorithm part reads: response-aligned token tensors, one row per experience.

Built by the trainer's loop (services/trainer/batching.py) and read by the advantage fns here and
the trainer's losses; the explorer builds none, but its step-wise advantages follow the same row
layout. Pure torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from torch import Tensor

from services.common.errors import InvalidArgument


@dataclass
class TrainBatch:
    """One training batch (or micro-batch), response-aligned, right-padded to T = max response length.

    Shapes: B rows, T response tokens. Token tensors are float32 unless noted.
    """

    action_mask: Tensor  # [B, T] float, 1 = token counts in the loss, 0 on padding / tool output
    old_logprob: Tensor  # [B, T] logprobs under the behaviour (generating) policy
    rewards: Tensor  # [B] scalar reward per sequence
    group_index: Tensor  # [B] long, rows with equal value form one GRPO group (same task, same step)
    model_version: Tensor  # [B] long, weights version that generated each row
    ref_logprob: Tensor | None = None  # [B, T] reference-model logprobs (algorithms using KL)
    values: Tensor | None = None  # [B, T] critic values at rollout time (PPO/GAE)
    token_level_rewards: Tensor | None = None  # [B, T] (overrides rewards placed on the last token)
    advantages: Tensor | None = None  # [B, T] filled by compute_advantages (or given by the producer)
    returns: Tensor | None = None  # [B, T] filled by compute_advantages (critic targets)
    is_expert: Tensor | None = None  # [B] bool, rows from the SFT/expert buffer (mix)
    pair_index: Tensor | None = None  # [B] long, DPO: rows 2k (chosen) and 2k+1 (rejected) share a pair
    run_index: Tensor | None = None  # [B] long, rows of one run (multi-step rollout) share it
    step_index: Tensor | None = None  # [B] long, position of the row's model call within its run
    teacher_logprob: Tensor | None = None  # [B, T] teacher logprobs (on-policy distillation)
    entropy: Tensor | None = None  # [B, T] current model's entropy before the update (clipb)
    rollout_logprob: Tensor | None = None  # [B, T] the engine's logprobs, kept when the trainer
    #   recomputed old_logprob (bypass_old_logprobs false); the rollout correction's denominator
    m2po_mask: Tensor | None = None  # [B, T] M2PO's batch-wide token mask (set before each update)

    @property
    def batch_size(self) -> int:
        return int(self.action_mask.shape[0])

    def __len__(self) -> int:
        return self.batch_size

    def require(self, name: str) -> Tensor:
        """The tensor field `name`, or InvalidArgument naming it when the producer left it unset."""
        value = getattr(self, name)
        if value is None:
            raise InvalidArgument(
                f"this algorithm needs batch.{name}, which is not set", field=f"batch.{name}"
            )
        return value

    def select(self, idx: Tensor) -> TrainBatch:
        """Rows `idx` (1-D long or bool tensor) of every tensor field; used for micro-batching.

        DPO micro-batches must keep pairs together: pass indices that contain both 2k and 2k+1.
        """
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            picked[f.name] = value[idx] if value is not None else None
        return replace(self, **picked)  # type: ignore[arg-type]

    def to(self, device: object) -> TrainBatch:
        """Every tensor field moved to `device`."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = value.to(device) if value is not None else None
        return replace(self, **moved)  # type: ignore[arg-type]
