"""The contract between the training loop and the algorithm library.

The loop (services/trainer/*.py) only touches what is defined here:

    algo = build_algorithm(cfg.algorithm)           # services.trainer.algorithms.build_algorithm
    for req in algo.sample_strategy.plan(train_batch_size=N, model_version=v):   # step=v+1 by default
        rows += read(buffer_for(req.source), req.batch_size, min_model_version=req.min_model_version)
        # rows read for a request with req.is_expert=True get batch.is_expert = True
    batch = TrainBatch(...)                         # response-aligned, right-padded to T
    if algo.use_reference: batch.ref_logprob = ref_model(...)     # frozen copy of the initial model
    if algo.use_critic:    batch.values = critic(...)
    adv_metrics = algo.compute_advantages(batch)    # once per batch, before the micro-batches
                                                    # (KL reward penalty; rows GRPO's std_threshold
                                                    # drops get action_mask 0)
    for mb_idx in micro_batches:                    # ppo_epochs x micro-batches
        mb = batch.select(mb_idx)
        logprob, entropy = policy(mb)               # [b, T], grad flows through logprob
        loss, metrics = algo.compute_loss(mb, logprob, entropy, values, loss_scale=len(mb_idx) / len(batch))
        loss.backward()

No torch.nn modules, no optimizer, no I/O here: every part is a pure function over tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

from torch import Tensor

from services.common.errors import InvalidArgument

Source = Literal["experience", "auxiliary"]


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


@dataclass(frozen=True)
class ReadRequest:
    """One read the loop must make for one training step.

    source: "experience" = buffer.trainer_input.experience_buffer; "auxiliary" = the buffer named
    `buffer_name` in buffer.trainer_input.auxiliary_buffers (SFT/expert data for mix).
    min_model_version: rows generated by older weights must be skipped (staleness_control);
    0 = no bound.
    is_expert: rows of this read are expert rows (TrainBatch.is_expert = True).
    """

    source: Source
    batch_size: int
    min_model_version: int = 0
    is_expert: bool = False
    buffer_name: str = ""


class SampleStrategy:
    """Decides which buffer(s) the loop reads for a step, and how many rows from each.

    `plan` is called once per training step with the configured train batch size and the model
    version the trainer currently holds; `step` is the training step about to run (default
    model_version + 1). Built-ins: default, staleness_control (min_model_version =
    max(step - max_staleness, 0)), mix (expert rows, ceil(expert_data_ratio * N), from the auxiliary
    buffer `sft_dataset_name`; the rest from the experience buffer). See sample_strategy.py.
    """

    name: str = "default"

    def plan(
        self, *, train_batch_size: int, model_version: int, step: int | None = None
    ) -> list[ReadRequest]:
        raise NotImplementedError


class Algorithm:
    """A composed algorithm. Built by `build_algorithm(cfg: AlgorithmConfig)`.

    Flags tell the loop what to compute before calling in:
      use_reference: compute batch.ref_logprob with a frozen copy of the initial model.
      use_critic: run a value head / critic; pass its values to compute_loss (value loss added).
      needs_old_logprob: False for SFT/DPO (old_logprob may be zeros).
      zero_advantage_is_inert: a row whose advantages are all 0 adds exactly nothing to the loss or
        its gradient (an advantage-scaled policy loss, no KL loss, entropy term, critic or SFT
        part), so the engine may leave such rows out of the forward/backward passes.
    """

    name: str
    use_reference: bool
    use_critic: bool
    needs_old_logprob: bool
    zero_advantage_is_inert: bool = False
    sample_strategy: SampleStrategy

    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """Fill batch.advantages / batch.returns (applying the KL reward penalty first). Metrics back."""
        raise NotImplementedError

    def compute_loss(
        self,
        batch: TrainBatch,
        logprob: Tensor,
        entropy: Tensor | None,
        values: Tensor | None = None,
        *,
        loss_scale: float = 1.0,
    ) -> tuple[Tensor, dict[str, float]]:
        """Total scalar loss of this micro-batch, times loss_scale, and Trinity-named metrics.

        logprob, entropy: [B, T] under the current policy (grad through logprob and values).
        loss = policy loss + kl_coef * kl loss - entropy_coef * entropy (+ value loss when use_critic),
        each aggregated with loss_agg_mode. Metrics: pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl,
        kl_loss, entropy_loss, (vf_loss, vf_clipfrac), ... unscaled by loss_scale.
        """
        raise NotImplementedError
