"""`trainer:` — the torch training loop (Trinity-RFT's keys where they exist)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.common.config.base import Section


class TrainerConfig(Section):
    name: str = "trainer"
    """Member name."""
    trainer_type: Literal["torch"] = "torch"
    """Training backend; this project ships a plain torch loop (veRL configs need porting)."""
    save_interval: int = Field(100, ge=1)
    """Full checkpoint (model, optimizer, step, data cursor) every this many steps."""
    total_steps: int | None = Field(None, ge=1)
    """Stop after this many steps (else at end of data)."""
    save_strategy: Literal["single_thread", "single_process", "single_node", "unrestricted"] = "unrestricted"
    """Accepted for Trinity compatibility."""
    micro_batch_size: int = Field(8, ge=1)
    """Experiences per forward/backward; gradients accumulate to train_batch_size."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each batch."""
    gradient_checkpointing: bool = False
    """Trade compute for memory."""
    bf16: bool = True
    """bf16 autocast on GPU (ignored on CPU)."""
    max_checkpoints_to_keep: int = Field(3, ge=1)
    """Full checkpoints kept; older ones are pruned."""
    read_timeout_s: float = Field(60.0, gt=0)
    """Seconds one batch read may wait before the trainer logs that it is starved and retries."""
    strategy: Literal["single", "fsdp2"] = "single"
    """single: one process (one GPU or CPU); fsdp2: torch FSDP2, started as
    `torchrun --nproc_per_node N -m services.trainer --config F` (rank 0 serves and talks to the other services)."""
