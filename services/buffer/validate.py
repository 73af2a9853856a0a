"""Validation of incoming experiences without a full decode.

`wire.experience_from_proto` builds numpy arrays and dicts (tens of µs per experience); the
buffer stores the bytes as sent, so it only needs the checks. `wire.validate_experience_message`
makes exactly those checks on the message (lengths from len(raw) / itemsize, dtypes, ranges,
model_version), with the float arrays of the whole write checked for finiteness in one numpy
pass at the end. The buffer also rejects non-finite metrics (the trainer logs them).
Every experience of a write is checked before anything is stored: a rejected write changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from services.buffer.types import ItemIn
from services.common.errors import InvalidArgument
from services.common.wire import DeferredFloats, check_deferred_floats, validate_experience_message
from trinity_grpc.common.v1 import common_pb2 as pb


def check_experience(msg: pb.Experience, where: str, deferred: DeferredFloats | None = None) -> None:
    """Raise InvalidArgument naming `where.<field>` when `msg` is not a valid Experience
    (finiteness checks of packed float arrays go to `deferred` when given)."""
    validate_experience_message(msg, where, deferred)
    if msg.metrics:
        for key, value in msg.metrics.items():
            if not math.isfinite(value):
                raise InvalidArgument(f"metric {key!r} must be finite, got {value}", field=f"{where}.metrics")


def check_count(n: int, max_items: int) -> None:
    if n > max_items:
        raise InvalidArgument(
            f"{n} experiences in one call; the limit is buffer.max_batch_items = {max_items}: split the write",
            field="experiences",
        )


def to_items(
    experiences: Sequence[pb.Experience], *, max_items: int, payloads: Sequence[bytes] | None = None
) -> list[ItemIn]:
    """Validate a whole write and turn it into rows (serialized bytes + model version).
    `payloads`: the experiences' bytes as received (see server.py), saving a re-serialization."""
    check_count(len(experiences), max_items)
    deferred: DeferredFloats = []
    for i, msg in enumerate(experiences):
        check_experience(msg, f"experiences[{i}]", deferred)
    check_deferred_floats(deferred)
    if payloads is None:
        payloads = [msg.SerializeToString() for msg in experiences]
    return [ItemIn(p, msg.model_version) for p, msg in zip(payloads, experiences, strict=True)]
