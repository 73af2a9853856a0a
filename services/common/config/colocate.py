"""What `mode: colocate` needs (Trinity v0.5's mode: explorer and trainer on one device, the trainer
driving the sync), checked once when the config loads.

Here the two stay separate processes, as in mode both, but hold one copy of the policy's weights:
the trainer's parameters live in shared memory and the explorer's transformers engine maps them
(services/synchronizer/transfer/shared.py); a vLLM engine, which keeps its own layout, copies each
version from them (no checkpoint, no socket). That fixes what the rest of the config may say: one
rollout engine (either kind), one trainer
process (an FSDP shard is not the whole model), no LoRA (the engine would need the merged weights,
a copy), and the on-policy plan, in which the explorer always waits for the version the trainer
just made, so the two take turns on the device.
"""

from __future__ import annotations

from typing import Any


def colocate_problem(cfg: Any) -> str | None:
    """The first key that mode colocate cannot run with, as a message naming it; None when it can."""
    rollout, sync = cfg.explorer.rollout_model, cfg.synchronizer
    if rollout.engine_num != 1 or cfg.explorer.replicas != 1:
        return (
            "mode colocate runs one rollout engine beside the trainer: set explorer.rollout_model.engine_num 1 "
            f"and explorer.replicas 1 (got {rollout.engine_num} and {cfg.explorer.replicas})"
        )
    if rollout.tensor_parallel_size != 1:
        return "mode colocate with explorer.rollout_model.tensor_parallel_size > 1: the engine holds the whole model"
    if cfg.trainer.strategy != "single":
        return (
            "mode colocate with trainer.strategy fsdp2: a rank holds a shard, the engine needs the whole model; "
            "use strategy single"
        )
    if cfg.model.lora is not None:
        return (
            "mode colocate with model.lora_configs: the engine would need the adapter merged into a copy of the "
            "weights; remove lora_configs or use mode both"
        )
    if sync.sync_interval != 1 or sync.sync_offset != 0 or sync.normalized_style != "fixed":
        return (
            f"mode colocate with sync_interval {sync.sync_interval}, sync_offset {sync.sync_offset}, sync_style "
            f"{sync.sync_style!r}: explorer and trainer share one copy of the weights and take turns on it, "
            "so the plan is on-policy; set synchronizer.sync_interval 1, sync_offset 0, sync_style fixed"
        )
    return None
