"""Validation of incoming experiences without a full decode.

`wire.experience_from_proto` builds numpy arrays and dicts (tens of µs per experience); the
buffer stores the bytes as sent, so it only needs the checks: arrays have an allowed dtype and a
whole number of elements, lengths agree, prompt_length is in range, reward and floats are
finite, model_version is set. Raw-bytes arrays (the fast path) are checked from their byte
length plus one vectorized finiteness check; other arrays go through `wire.array_from_proto`.
Every experience of a write is checked before anything is stored: a rejected write changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from services.buffer.types import ItemIn
from services.common.errors import InvalidArgument
from services.common.wire import _TO_NUMPY, array_from_proto
from trinity_grpc.common.v1 import common_pb2 as pb

_KIND = {"int": "i", "float": "f", "bool": "u"}
_ALLOWED = {"int": "INT32/INT64", "float": "FLOAT32/FLOAT64", "bool": "BOOL"}
_RESPONSE = (
    ("logprobs", "float"),
    ("action_mask", "bool"),
    ("token_level_rewards", "float"),
    ("advantages", "float"),
    ("returns", "float"),
)


def _length(
    arr: pb.Array, field: str, expect: str, deferred: list[tuple[bytes, np.dtype, str, str]] | None = None
) -> int:
    """Number of elements of `arr` after checking its dtype (and values, or defers the value
    check of raw arrays to one vectorized pass in `deferred`); 0 when empty."""
    raw = arr.raw
    if not raw or arr.int_values or arr.float_values:
        values = array_from_proto(arr, field, expect=expect)  # slow path, full checks
        if values is not None and expect == "float" and not np.all(np.isfinite(values)):
            raise InvalidArgument("values must be finite", field=field)
        return 0 if values is None else int(values.shape[0])
    dtype = _TO_NUMPY.get(arr.dtype)
    if dtype is None:
        raise InvalidArgument("dtype is required when values are present", field=f"{field}.dtype")
    if dtype.kind != _KIND[expect]:
        name = pb.ElementType.Name(arr.dtype)
        raise InvalidArgument(
            f"dtype {name} is not allowed here; expected {_ALLOWED[expect]}", field=f"{field}.dtype"
        )
    if len(raw) % dtype.itemsize:
        raise InvalidArgument(
            f"raw has {len(raw)} bytes, not a multiple of the {dtype.itemsize}-byte element",
            field=f"{field}.raw",
        )
    if expect != "int":
        if deferred is not None:
            deferred.append((raw, dtype, field, expect))
        else:
            _check_values([(raw, dtype, field, expect)])
    return len(raw) // dtype.itemsize


def _check_values(arrays: list[tuple[bytes, np.dtype, str, str]]) -> None:
    """Finite floats and 0/1 bools, one numpy pass per dtype; on failure, find the culprit."""
    groups: dict[tuple[np.dtype, str], list[tuple[bytes, str]]] = {}
    for raw, dtype, field, expect in arrays:
        groups.setdefault((dtype, expect), []).append((raw, field))
    for (dtype, expect), members in groups.items():
        values = np.frombuffer(b"".join(raw for raw, _ in members), dtype=dtype)
        ok = np.isfinite(values).all() if expect == "float" else (values.size == 0 or values.max() <= 1)
        if ok:
            continue
        for raw, field in members:
            v = np.frombuffer(raw, dtype=dtype)
            if expect == "float" and not np.isfinite(v).all():
                raise InvalidArgument("values must be finite", field=field)
            if expect == "bool" and v.size and v.max() > 1:
                raise InvalidArgument("bool values must be 0 or 1", field=field)


def check_experience(
    msg: pb.Experience, where: str, deferred: list[tuple[bytes, np.dtype, str, str]] | None = None
) -> None:
    """Raise InvalidArgument naming `where.<field>` when `msg` is not a valid Experience
    (value checks of raw arrays go to `deferred` when given; see `_check_values`)."""
    if not msg.HasField("model_version") or msg.model_version < 0:
        raise InvalidArgument(
            "model_version is required and must be >= 0 (0 for the base model)",
            field=f"{where}.model_version",
        )
    if msg.HasField("reward") and not math.isfinite(msg.reward):
        raise InvalidArgument(f"reward must be finite, got {msg.reward}", field=f"{where}.reward")
    for key, value in msg.metrics.items():
        if not math.isfinite(value):
            raise InvalidArgument(f"metric {key!r} must be finite, got {value}", field=f"{where}.metrics")
    n = _length(msg.tokens, f"{where}.tokens", "int")
    _length(msg.chosen, f"{where}.chosen", "int")
    _length(msg.rejected, f"{where}.rejected", "int")
    if n == 0:
        if not len(msg.messages) and not msg.chosen.raw and not msg.chosen.int_values:
            raise InvalidArgument(
                "an experience needs tokens, messages or chosen/rejected", field=f"{where}.tokens"
            )
        return
    if not 0 <= msg.prompt_length < n:
        raise InvalidArgument(
            f"prompt_length must be in [0, {n}) for {n} tokens, got {msg.prompt_length}",
            field=f"{where}.prompt_length",
        )
    response = n - msg.prompt_length
    for name, expect in _RESPONSE:
        length = _length(getattr(msg, name), f"{where}.{name}", expect, deferred)
        if length and length != response:
            raise InvalidArgument(
                f"length {length} does not match the response length {response} "
                f"(len(tokens) {n} - prompt_length {msg.prompt_length})",
                field=f"{where}.{name}",
            )


def to_items(experiences: Sequence[pb.Experience], *, max_items: int) -> list[ItemIn]:
    """Validate a whole write and turn it into rows (serialized bytes + model version)."""
    if len(experiences) > max_items:
        raise InvalidArgument(
            f"{len(experiences)} experiences in one call; the limit is buffer.max_batch_items = {max_items}: "
            "split the write",
            field="experiences",
        )
    deferred: list[tuple[bytes, np.dtype, str, str]] = []
    for i, msg in enumerate(experiences):
        check_experience(msg, f"experiences[{i}]", deferred)
    _check_values(deferred)
    return [ItemIn(msg.SerializeToString(), int(msg.model_version)) for msg in experiences]
