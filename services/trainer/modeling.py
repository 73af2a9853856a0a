"""Model-side pieces of the training step: the critic (a causal LM's backbone plus a value head), the
data facts and loss sums reported per step, and what a model's forward accepts. Logprobs and entropy
from logits: logprobs.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from services.trainer.batching import Batch, ModelInputs
from services.trainer.ulysses import SequenceParallel
from services.trainer.ulysses_forward import sharded_values


class ValueModel(nn.Module):
    """A critic: the backbone of a causal LM plus a linear head giving one value per token."""

    sequence_parallel: SequenceParallel | None = None  # Ulysses: set by ulysses.setup_sequence_parallel

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        hf: Any = lm  # a transformers PreTrainedModel: base_model and config come from its interface
        self.backbone: nn.Module = hf.base_model
        self._no_split_modules = getattr(lm, "_no_split_modules", None)  # FSDP shards these blocks
        hidden = int(hf.config.hidden_size)
        self.value_head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, inputs: ModelInputs) -> Tensor:
        """Values [b, T] at the positions that predict each response token (aligned with logprobs)."""
        if self.sequence_parallel is not None:  # inside this forward, so FSDP has gathered the head
            return sharded_values(self.backbone, self.value_head, inputs, self.sequence_parallel)
        out = self.backbone(
            input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, position_ids=inputs.position_ids
        )
        p, t = inputs.prompt_width, inputs.response_width
        hidden = out.last_hidden_state[:, p - 1 : p + t - 1]
        return self.value_head(hidden.float()).squeeze(-1)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing on a transformers model (a peft wrapper passes it on): each layer's
    activations are recomputed in the backward pass instead of kept from the forward."""
    hf: Any = model
    # transformers 5 renamed it (the old name warns); older versions only have the old one.
    if hasattr(hf, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable({"use_reentrant": False})
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def batch_metrics(batch: Batch) -> dict[str, float]:
    """Data facts of a step: rows, tokens, response length, reward."""
    mask = batch.train.action_mask
    return {
        "batch/rows": float(len(batch)),
        "batch/tokens": float(batch.inputs.num_tokens),
        "response_length/mean": float(batch.inputs.response_lengths.float().mean()),
        "critic/rewards/mean": float(batch.train.rewards.mean()),
        "batch/action_tokens": float(mask.sum()),
    }


def read_sums(sums: dict[str, float | Tensor]) -> dict[str, float]:
    """The step's loss metrics as floats: the tensors among them read in one transfer."""
    keys = [k for k, v in sums.items() if isinstance(v, Tensor)]
    out = {k: float(v) for k, v in sums.items() if not isinstance(v, Tensor)}
    if keys:
        values = torch.stack([torch.as_tensor(sums[k]).float().reshape(()) for k in keys]).tolist()
        out.update(zip(keys, values, strict=True))
    return out


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Does the model's forward take `logits_to_keep` (a peft wrapper passes it on to the model inside)?"""
    import inspect

    unwrap = getattr(model, "get_base_model", None)
    inner = unwrap() if callable(unwrap) else model
    try:
        return "logits_to_keep" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False
