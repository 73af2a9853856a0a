"""The training engine's settings (from the config's algorithm.optimizer and trainer sections) and the
learning-rate schedule they define.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.config.schema import TrinityConfig
from services.common.errors import InvalidArgument


@dataclass(frozen=True)
class EngineSettings:
    """The knobs of the step, gathered from trainer:, algorithm.optimizer: and model:."""

    micro_batch_size: int = 8
    tokens_per_micro_batch: int | None = None  # trainer.use_dynamic_bsz: micro-batches by token budget
    ulysses_size: int = 1  # ranks a sequence is split over (trainer.ulysses_sequence_parallel_size)
    ppo_epochs: int = 1
    critic_warmup: int = 0  # first steps train only the critic
    lr: float = 1e-6
    critic_lr: float | None = None  # the critic's lr when it differs (veRL's critic.optim.lr)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_steps: int = 0
    warmup_style: str = "constant"
    min_lr_ratio: float = 0.0
    total_steps: int | None = None
    gradient_checkpointing: bool = False
    logprob_chunk_size: int | None = 256  # positions per block of the logprob/entropy computation
    bf16: bool = True
    temperature: float = 1.0  # logits are divided by the rollout temperature, as the sampler did

    @classmethod
    def from_config(cfg_cls, cfg: TrinityConfig) -> EngineSettings:
        opt = cfg.algorithm.optimizer
        total = cfg.trainer.total_steps or cfg.buffer.total_steps
        warmup = opt.lr_warmup_steps
        if warmup == 0 and opt.lr_warmup_steps_ratio > 0:
            if total is None:
                raise InvalidArgument(
                    "lr_warmup_steps_ratio needs a known number of steps: set trainer.total_steps "
                    "(or use lr_warmup_steps)",
                    field="algorithm.optimizer.lr_warmup_steps_ratio",
                )
            warmup = int(opt.lr_warmup_steps_ratio * total)
        if opt.schedule == "cosine" and total is None:
            raise InvalidArgument(
                "warmup_style cosine needs trainer.total_steps", field="algorithm.optimizer.warmup_style"
            )
        # the sampling temperature the explorer used: the training taskset's rollout_args, which the
        # loader resolved (model.temperature included, config/tasksets.py; mixed tasksets share one)
        training = cfg.buffer.explorer_input.training_tasksets()
        rollout_args = training[0][1].rollout_args if training else cfg.model.rollout_defaults
        temperature = float(rollout_args.get("temperature", 1.0) or 1.0)
        # veRL's rule: a micro-batch split over N ranks holds N x max_token_len_per_gpu tokens
        ulysses = cfg.trainer.ulysses_sequence_parallel_size
        budget = cfg.trainer.tokens_per_micro_batch
        return cfg_cls(
            micro_batch_size=cfg.trainer.effective_micro_batch_size,
            tokens_per_micro_batch=budget * ulysses if budget is not None else None,
            ulysses_size=ulysses,
            ppo_epochs=cfg.trainer.ppo_epochs,
            critic_warmup=cfg.trainer.critic_warmup,
            lr=opt.lr,
            critic_lr=cfg.trainer.effective_critic_lr,
            betas=opt.betas,
            weight_decay=opt.weight_decay,
            grad_clip=cfg.grad_clip,
            warmup_steps=warmup,
            warmup_style=opt.schedule,
            min_lr_ratio=opt.min_lr_ratio,
            total_steps=total,
            gradient_checkpointing=cfg.trainer.effective_gradient_checkpointing,
            logprob_chunk_size=cfg.trainer.logprob_chunk_size,
            bf16=cfg.trainer.bf16,
            temperature=temperature,
        )


def lr_factor(step: int, s: EngineSettings) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based).

    Linear warm-up reaching 1 at step warmup_steps-1 (so step 0 already learns), then constant or
    cosine decay to min_lr_ratio at total_steps.
    """
    if step < s.warmup_steps:
        return (step + 1) / s.warmup_steps
    if s.warmup_style != "cosine" or not s.total_steps:
        return 1.0
    progress = min(1.0, (step - s.warmup_steps) / max(1, s.total_steps - s.warmup_steps))
    return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
