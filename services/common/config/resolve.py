"""Defaults that depend on another section, resolved once when the config is loaded.

The loader applies `resolve_derived` to every validated config (and stage), beside the tasksets'
resolution (tasksets.py), so every process, `trinity config check` and the resolved YAML a stage
writes see the same values and no service derives them again:

| key left unset | becomes |
| --- | --- |
| trainer.max_token_len_per_gpu, with use_dynamic_bsz | ceil(2 x model's max_model_len / ulysses_sequence_parallel_size) (Trinity's rule) |
| explorer.rollout_model.enable_thinking, auxiliary_models[].enable_thinking | model.enable_thinking |
| synchronizer.bucket_mb, with rollout_model.weight_sync_buffer_size | weight_sync_buffer_size (one setting, two names) |
| buffer.trainer_input.experience_buffer.name, given as "" (a section without `name`) | `experience_buffer`, the default section's name |
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from services.common.config.buffer import EXPERIENCE_BUFFER

if TYPE_CHECKING:
    from services.common.config.schema import TrinityConfig


def token_budget(cfg: TrinityConfig) -> int | None:
    """trainer.max_token_len_per_gpu as the trainer uses it: given, or Trinity's default with use_dynamic_bsz."""
    trainer = cfg.trainer
    if trainer.max_token_len_per_gpu is not None or not trainer.use_dynamic_bsz:
        return trainer.max_token_len_per_gpu
    return math.ceil(2 * cfg.model.effective_max_model_len / trainer.ulysses_sequence_parallel_size)


def resolve_derived(cfg: TrinityConfig) -> TrinityConfig:
    """`cfg` with the keys of the module's table decided (a copy; idempotent)."""
    thinking = cfg.model.enable_thinking
    rollout = cfg.explorer.rollout_model
    auxiliary = [
        aux if aux.enable_thinking is not None else aux.model_copy(update={"enable_thinking": thinking})
        for aux in cfg.explorer.auxiliary_models
    ]
    explorer = cfg.explorer.model_copy(
        update={
            "rollout_model": rollout
            if rollout.enable_thinking is not None
            else rollout.model_copy(update={"enable_thinking": thinking}),
            "auxiliary_models": auxiliary,
        }
    )
    updates: dict[str, Any] = {
        "explorer": explorer,
        "trainer": cfg.trainer.model_copy(update={"max_token_len_per_gpu": token_budget(cfg)}),
    }
    if rollout.weight_sync_buffer_size is not None:
        updates["synchronizer"] = cfg.synchronizer.model_copy(
            update={"bucket_mb": rollout.weight_sync_buffer_size}
        )
    experience = cfg.buffer.trainer_input.experience_buffer
    if not experience.name:
        trainer_input = cfg.buffer.trainer_input.model_copy(
            update={"experience_buffer": experience.model_copy(update={"name": EXPERIENCE_BUFFER})}
        )
        updates["buffer"] = cfg.buffer.model_copy(update={"trainer_input": trainer_input})
    resolved = cfg.model_copy(update=updates)
    resolved._stage_configs = cfg._stage_configs
    return resolved
