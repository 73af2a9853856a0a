"""The model's side of Ulysses sequence parallelism (ulysses.py): a micro-batch's columns split over
the group, the full-sequence attention mask, and the per-position outputs gathered back.

Each rank of a group holds the whole micro-batch (ModelInputs [b, L]). It pads the rows on the
right to L' (a multiple of N; padding is masked out, after every real token, so no real position
sees it), keeps its L'/N columns of input_ids and position_ids (the global positions), and builds
the [b, 1, L', L'] mask the model would build for the full rows. Its logits then cover its own
L'/N positions; each position's logprob is of the token after it, so the labels are the full row
shifted by one and cut the same way. The logprobs (entropy, values) of all ranks are gathered to
[b, L'] and the response's T positions, P-1 .. P+T-2, are cut from it as in the one-process path.
The prompt's positions are computed too (no logits_to_keep): the shard of one rank rarely holds
only response positions.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from services.trainer.batching import ModelInputs
from services.trainer.logprobs import response_logprobs
from services.trainer.ulysses import SequenceParallel, gather_sequence, padded_length, shard_slice


@dataclass(frozen=True)
class ShardedInputs:
    """One rank's share of a micro-batch, ready for the model's forward."""

    input_ids: Tensor  # [b, L'/N] this rank's columns of the right-padded rows
    position_ids: Tensor  # [b, L'/N] their global positions
    attention_mask: Tensor  # [b, 1, L', L'] the full rows' mask (bool for sdpa, additive for eager)
    labels: Tensor  # [b, L'/N] the token each of these positions predicts (the next one; pad at the end)

    def model_kwargs(self) -> dict[str, Any]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }


def full_attention_mask(model: nn.Module, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
    """The 4D mask [b, 1, L, L] the model builds for rows [b, L] (its own mask function, never skipped
    for is_causal: the model sees only L/N query positions, so it cannot infer the causal mask)."""
    from transformers.masking_utils import create_causal_mask

    hf: Any = model  # a transformers PreTrainedModel (or a peft wrapper of one)
    config, embeddings = hf.config, hf.get_input_embeddings()
    b, length = attention_mask.shape
    shape_only = torch.empty(b, length, 0, dtype=embeddings.weight.dtype, device=attention_mask.device)
    mask = create_causal_mask(
        config=config,
        inputs_embeds=shape_only,
        attention_mask=attention_mask,
        cache=None,
        position_ids=position_ids,
        allow_is_causal_skip=False,
    )
    if not isinstance(mask, Tensor) or mask.dim() != 4:
        raise RuntimeError(
            f"expected a 4D attention mask for {config._attn_implementation}, got {type(mask)}"
        )
    return mask


def shard_inputs(model: nn.Module, inputs: ModelInputs, sp: SequenceParallel) -> ShardedInputs:
    """This rank's columns of `inputs` (see the module doc)."""
    b, length = inputs.input_ids.shape
    pad = padded_length(length, sp.size) - length
    input_ids = F.pad(inputs.input_ids, (0, pad), value=0)
    mask_2d = F.pad(inputs.attention_mask, (0, pad), value=0)
    positions = F.pad(inputs.position_ids, (0, pad), value=0)
    labels = F.pad(input_ids[:, 1:], (0, 1), value=0)
    cols = shard_slice(length + pad, sp.size, sp.rank)
    return ShardedInputs(
        input_ids=input_ids[:, cols],
        position_ids=positions[:, cols],
        attention_mask=full_attention_mask(model, mask_2d, positions),
        labels=labels[:, cols],
    )


def response_part(local: Tensor, inputs: ModelInputs, sp: SequenceParallel) -> Tensor:
    """The group's per-position [b, L'/N] shards gathered, cut to the response: [b, T]."""
    full = gather_sequence(local, sp)
    start = inputs.prompt_width - 1
    return full[:, start : start + inputs.response_width]


def sharded_logits(model: nn.Module, inputs: ModelInputs, sp: SequenceParallel) -> tuple[Tensor, Tensor]:
    """This rank's logits [b, L'/N, V] and the tokens [b, L'/N] whose logprobs they give."""
    shard = shard_inputs(model, inputs, sp)
    out = model(**shard.model_kwargs(), use_cache=False)
    return out.logits, shard.labels


class LogprobOptions(NamedTuple):
    """response_logprobs' keyword arguments, as the engine sets them."""

    temperature: float
    chunk_tokens: int | None
    with_entropy: bool
    entropy_grad: bool


def sharded_logprobs(
    model: nn.Module,
    inputs: ModelInputs,
    sp: SequenceParallel,
    autocast: contextlib.AbstractContextManager[Any],
    options: LogprobOptions,
) -> tuple[Tensor, Tensor | None]:
    """Logprob (and entropy) [b, T] of the response tokens, the model run on this rank's positions
    under `autocast` and every rank's gathered: the same numbers as the one-process path."""
    with autocast:
        logits, labels = sharded_logits(model, inputs, sp)
    logprob, entropy = response_logprobs(logits, 0, labels, **options._asdict())
    if entropy is not None:
        entropy = response_part(entropy, inputs, sp)
    return response_part(logprob, inputs, sp), entropy


def sharded_values(backbone: nn.Module, head: nn.Module, inputs: ModelInputs, sp: SequenceParallel) -> Tensor:
    """A critic's values [b, T] under sequence parallelism (ValueModel.forward's split form)."""
    shard = shard_inputs(backbone, inputs, sp)
    hidden = backbone(**shard.model_kwargs()).last_hidden_state  # [b, L'/N, hidden]
    local = head(hidden.float()).squeeze(-1)
    return response_part(local, inputs, sp)
