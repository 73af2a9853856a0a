"""What a checkpoint holds of the training engine: the policy's full weights, and the optimizer,
scheduler, critic and step count (`TrainEngine` inherits these from `EngineState`).

Without FSDP each is the module's own state dict. Under FSDP the weights and the optimizer state
are gathered in full on rank 0 (keyed by parameter name, not by shard), so a checkpoint written
under one world size resumes under another of the same strategy; loading scatters them back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from services.trainer.distributed import (
    DistContext,
    full_model_state,
    gather_training_state,
    scatter_training_state,
)
from services.trainer.lora import is_lora, merged_state_dict
from services.trainer.modeling import ValueModel


class EngineState:
    """The checkpoint state of a TrainEngine (whose __init__ sets these attributes)."""

    dist: DistContext | None
    model: nn.Module
    critic: ValueModel | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    step: int
    _trainables: nn.ModuleDict

    def full_model_state(self) -> dict[str, Tensor]:
        """The policy's full (unsharded) weights; under FSDP a collective, filled on rank 0 only (CPU).

        With LoRA: the base weights with the adapter merged, under the base model's names (lora.py)."""
        if self.dist is None:
            if is_lora(self.model):
                return merged_state_dict(self.model)
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        return full_model_state(self.model)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler, critic and step (the model's weights are saved separately, HF format).

        Under FSDP the optimizer state is gathered in full (keyed by parameter name) on rank 0, so
        a checkpoint resumes under any world size of the same strategy.
        """
        state: dict[str, Any] = {"scheduler": self.scheduler.state_dict(), "step": self.step}
        if self.dist is None:
            state["optimizer"] = self.optimizer.state_dict()
            if self.critic is not None:
                state["critic"] = self.critic.state_dict()
            return state
        return {**state, **gather_training_state(self._trainables, self.optimizer, self.critic)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every rank passes the full state it read from the checkpoint."""
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        if self.dist is None:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.critic is not None and "critic" in state:
                self.critic.load_state_dict(state["critic"])
            return
        scatter_training_state(self._trainables, self.optimizer, self.critic, state)
