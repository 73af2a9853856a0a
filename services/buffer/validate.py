"""Validation of incoming experiences without a full decode.

`wire.experience_from_proto` builds dicts from `info` / `messages` (tens of µs each); the buffer
stores the bytes as sent, so it only needs the checks: arrays decode with an allowed dtype,
lengths agree, prompt_length is in range, reward and floats are finite, model_version is set.
Every experience of a write is checked before anything is stored, so a rejected write changes
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.buffer.kinds.items import ItemIn
from services.common.errors import InvalidArgument
from services.common.experience import Experience, validate_experience
from services.common.wire import array_from_proto
from trinity_grpc.common.v1 import common_pb2 as pb

_EMPTY_TOKENS = np.zeros(0, dtype=np.int32)


def check_experience(msg: pb.Experience, where: str) -> None:
    """Raise InvalidArgument naming `where.<field>` when `msg` is not a valid Experience."""
    if not msg.HasField("model_version"):
        raise InvalidArgument(
            "model_version is required (0 for the base model)", field=f"{where}.model_version"
        )
    tokens = array_from_proto(msg.tokens, f"{where}.tokens", expect="int")
    exp = Experience(
        tokens=tokens if tokens is not None else _EMPTY_TOKENS,
        prompt_length=int(msg.prompt_length),
        model_version=int(msg.model_version),
        reward=msg.reward if msg.HasField("reward") else None,
        logprobs=array_from_proto(msg.logprobs, f"{where}.logprobs", expect="float"),
        action_mask=array_from_proto(msg.action_mask, f"{where}.action_mask", expect="bool"),
        token_level_rewards=array_from_proto(
            msg.token_level_rewards, f"{where}.token_level_rewards", expect="float"
        ),
        advantages=array_from_proto(msg.advantages, f"{where}.advantages", expect="float"),
        returns=array_from_proto(msg.returns, f"{where}.returns", expect="float"),
        chosen=array_from_proto(msg.chosen, f"{where}.chosen", expect="int"),
        rejected=array_from_proto(msg.rejected, f"{where}.rejected", expect="int"),
    )
    if len(msg.messages) and not exp.tokens.size:
        exp.messages = [None]  # type: ignore[list-item]  # only its presence matters to the check
    validate_experience(exp, where)
    for key, value in msg.metrics.items():
        if not np.isfinite(value):
            raise InvalidArgument(f"metric {key!r} must be finite, got {value}", field=f"{where}.metrics")


def to_items(experiences: Sequence[pb.Experience], *, max_items: int) -> list[ItemIn]:
    """Validate a whole write and turn it into rows (serialized bytes + model version)."""
    if len(experiences) > max_items:
        raise InvalidArgument(
            f"{len(experiences)} experiences in one call; the limit is buffer.max_batch_items = {max_items}: split the write",
            field="experiences",
        )
    for i, msg in enumerate(experiences):
        check_experience(msg, f"experiences[{i}]")
    return [ItemIn(msg.SerializeToString(), int(msg.model_version)) for msg in experiences]
