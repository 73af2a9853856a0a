"""Conversion between domain types (services/common/experience.py) and protobuf messages.

Arrays travel as raw little-endian bytes plus an element type (the fast path: one memcpy each
way); `int_values` / `float_values` are accepted from callers that cannot pack bytes. Decoding
validates and raises InvalidArgument naming the field, so a servicer can reject a bad write
before anything is stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict

from services.common.errors import InvalidArgument
from services.common.experience import ChatMessage, Experience, Task
from services.common.values import check_bool_bytes, check_reward, ints_in_range, non_finite_message
from trinity_grpc.common.v1 import common_pb2 as pb

_TO_NUMPY: dict[pb.ElementType.ValueType, np.dtype[Any]] = {
    pb.ELEMENT_TYPE_INT32: np.dtype("<i4"),
    pb.ELEMENT_TYPE_INT64: np.dtype("<i8"),
    pb.ELEMENT_TYPE_FLOAT32: np.dtype("<f4"),
    pb.ELEMENT_TYPE_FLOAT64: np.dtype("<f8"),
    pb.ELEMENT_TYPE_BOOL: np.dtype("u1"),
}
_FROM_NUMPY: dict[np.dtype[Any], pb.ElementType.ValueType] = {
    np.dtype("int32"): pb.ELEMENT_TYPE_INT32,
    np.dtype("int64"): pb.ELEMENT_TYPE_INT64,
    np.dtype("float32"): pb.ELEMENT_TYPE_FLOAT32,
    np.dtype("float64"): pb.ELEMENT_TYPE_FLOAT64,
    np.dtype("bool"): pb.ELEMENT_TYPE_BOOL,
    np.dtype("uint8"): pb.ELEMENT_TYPE_BOOL,
}


def array_to_proto(arr: np.ndarray | None, out: pb.Array) -> None:
    """Fill `out` from a 1-D numpy array (None leaves it empty)."""
    if arr is None:
        return
    kind = _FROM_NUMPY.get(arr.dtype)
    if kind is None:
        raise InvalidArgument(f"unsupported array dtype {arr.dtype}")
    out.dtype = kind
    out.raw = np.ascontiguousarray(arr, dtype=_TO_NUMPY[kind]).tobytes()


def array_from_proto(msg: pb.Array, field: str, *, expect: str) -> np.ndarray | None:
    """Decode an Array; `expect` is "int", "float" or "bool". Empty arrays decode to None."""
    has_raw, has_int, has_float = bool(msg.raw), len(msg.int_values) > 0, len(msg.float_values) > 0
    if has_raw + has_int + has_float > 1:
        raise InvalidArgument("set only one of raw, int_values, float_values", field=field)
    if not (has_raw or has_int or has_float):
        return None
    dtype = _TO_NUMPY.get(msg.dtype)
    if dtype is None:
        raise InvalidArgument("dtype is required when values are present", field=f"{field}.dtype")
    kind_ok = {
        "int": dtype.kind == "i",
        "float": dtype.kind == "f",
        "bool": dtype.kind == "u",
    }[expect]
    if not kind_ok:
        allowed = {"int": "INT32/INT64", "float": "FLOAT32/FLOAT64", "bool": "BOOL"}[expect]
        name = pb.ElementType.Name(msg.dtype)
        raise InvalidArgument(f"dtype {name} is not allowed here; expected {allowed}", field=f"{field}.dtype")
    if has_raw:
        if len(msg.raw) % dtype.itemsize:
            raise InvalidArgument(
                f"raw has {len(msg.raw)} bytes, not a multiple of the {dtype.itemsize}-byte element",
                field=f"{field}.raw",
            )
        arr = np.frombuffer(msg.raw, dtype=dtype)
    elif has_int:
        if dtype.kind == "f":
            raise InvalidArgument("int_values given for a float dtype; use float_values", field=field)
        arr = ints_in_range(msg.int_values, dtype, field, is_bool=expect == "bool")
    else:
        if dtype.kind != "f":
            raise InvalidArgument("float_values given for an integer dtype; use int_values", field=field)
        with np.errstate(over="ignore"):  # overflow to inf: refused by the finiteness checks
            arr = np.asarray(msg.float_values, dtype=dtype)
    if expect == "bool":
        if has_raw:
            check_bool_bytes(msg.raw, field)
        return arr.astype(bool)
    if expect == "float":
        with np.errstate(over="ignore"):
            return arr.astype(np.float32, copy=False)
    return arr


def dict_to_struct(data: dict[str, Any] | None, out: struct_pb2.Struct) -> None:
    if data:
        out.update(jsonable(data))


def struct_to_dict(msg: struct_pb2.Struct) -> dict[str, Any]:
    return MessageToDict(msg) if msg.fields else {}


def jsonable(value: Any) -> Any:
    """Struct holds JSON values only: turn numpy scalars/arrays and tuples into plain types."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def experience_to_proto(exp: Experience, out: pb.Experience | None = None) -> pb.Experience:
    msg = out if out is not None else pb.Experience()
    array_to_proto(exp.tokens if exp.tokens is not None and exp.tokens.size else None, msg.tokens)
    msg.prompt_length = exp.prompt_length
    array_to_proto(exp.logprobs, msg.logprobs)
    array_to_proto(exp.action_mask, msg.action_mask)
    if exp.reward is not None:
        msg.reward = float(exp.reward)
    array_to_proto(exp.token_level_rewards, msg.token_level_rewards)
    array_to_proto(exp.advantages, msg.advantages)
    array_to_proto(exp.returns, msg.returns)
    msg.model_version = exp.model_version
    ids = msg.ids
    ids.task_id, ids.run_id, ids.group_id = exp.task_id, exp.run_id, exp.group_id
    ids.batch_id, ids.producer, ids.step = exp.batch_id, exp.producer, exp.step
    for key, value in exp.metrics.items():
        msg.metrics[key] = float(value)
    dict_to_struct(exp.info, msg.info)
    for m in exp.messages:
        cm = msg.messages.add(role=m.role, content=m.content)
        dict_to_struct(m.extra, cm.extra)
    array_to_proto(exp.chosen, msg.chosen)
    array_to_proto(exp.rejected, msg.rejected)
    msg.is_eval = exp.is_eval
    msg.response_text = exp.response_text
    msg.prompt_text = exp.prompt_text
    array_to_proto(exp.teacher_logprobs, msg.teacher_logprobs)
    return msg


def experience_from_proto(msg: pb.Experience, where: str = "experience") -> Experience:
    """Decode and validate; raises InvalidArgument naming `where.<field>`."""
    if not msg.HasField("model_version"):
        raise InvalidArgument(
            "model_version is required (0 for the base model)", field=f"{where}.model_version"
        )
    tokens = array_from_proto(msg.tokens, f"{where}.tokens", expect="int")
    exp = Experience(
        tokens=tokens if tokens is not None else np.zeros(0, dtype=np.int32),
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
        task_id=msg.ids.task_id,
        run_id=int(msg.ids.run_id),
        step=int(msg.ids.step),
        group_id=msg.ids.group_id,
        batch_id=int(msg.ids.batch_id),
        producer=msg.ids.producer,
        metrics=dict(msg.metrics),
        info=struct_to_dict(msg.info),
        messages=[ChatMessage(m.role, m.content, struct_to_dict(m.extra)) for m in msg.messages],
        chosen=array_from_proto(msg.chosen, f"{where}.chosen", expect="int"),
        rejected=array_from_proto(msg.rejected, f"{where}.rejected", expect="int"),
        is_eval=msg.is_eval,
        response_text=msg.response_text,
        prompt_text=msg.prompt_text,
        teacher_logprobs=array_from_proto(msg.teacher_logprobs, f"{where}.teacher_logprobs", expect="float"),
    )
    exp.validate(where)
    return exp


def task_to_proto(task: Task, out: pb.Task | None = None) -> pb.Task:
    msg = out if out is not None else pb.Task()
    msg.workflow, msg.reward_fn, msg.is_eval = task.workflow, task.reward_fn, task.is_eval
    msg.task_id, msg.index, msg.taskset, msg.repeat_times = (
        task.task_id,
        task.index,
        task.taskset,
        task.repeat_times,
    )
    dict_to_struct(task.raw_task, msg.raw_task)
    dict_to_struct(task.format_args, msg.format_args)
    dict_to_struct(task.rollout_args, msg.rollout_args)
    dict_to_struct(task.workflow_args, msg.workflow_args)
    return msg


def task_from_proto(msg: pb.Task) -> Task:
    return Task(
        workflow=msg.workflow,
        reward_fn=msg.reward_fn,
        raw_task=struct_to_dict(msg.raw_task),
        format_args=struct_to_dict(msg.format_args),
        rollout_args=struct_to_dict(msg.rollout_args),
        workflow_args=struct_to_dict(msg.workflow_args),
        is_eval=msg.is_eval,
        task_id=msg.task_id,
        index=int(msg.index),
        taskset=msg.taskset,
        repeat_times=int(msg.repeat_times) or 1,
    )


# ---- fast validation straight on the message (no numpy arrays, no dicts) ----------------------
_FAST_ARRAYS = (  # decode order of experience_from_proto, so the first error found is the same
    ("tokens", "int"),
    ("logprobs", "float"),
    ("action_mask", "bool"),
    ("token_level_rewards", "float"),
    ("advantages", "float"),
    ("returns", "float"),
    ("chosen", "int"),
    ("rejected", "int"),
)
_FAST_KIND = {"int": "i", "float": "f", "bool": "u"}
_FAST_ALLOWED = {"int": "INT32/INT64", "float": "FLOAT32/FLOAT64", "bool": "BOOL"}

# A float array whose finiteness is still to be checked: (raw bytes, element dtype, field).
DeferredFloats = list[tuple[bytes, np.dtype, str]]


def _fast_array(msg: pb.Array, where: str, name: str, expect: str) -> tuple[int, Any, Any]:
    """Check `msg` as array_from_proto would; returns (length, float values to check, dtype):
    raw bytes for packed float arrays (checked later, in bulk), an ndarray otherwise."""
    raw = msg.raw
    if not raw or msg.int_values or msg.float_values:  # empty, repeated scalars, or an error
        values = array_from_proto(msg, f"{where}.{name}", expect=expect)
        if values is None:
            return 0, None, None
        if expect == "float" and msg.float_values:  # as sent, so an overflow is named with its value
            return int(values.shape[0]), np.asarray(msg.float_values, dtype=np.float64), None
        return int(values.shape[0]), values if expect == "float" else None, None
    dtype = _TO_NUMPY.get(msg.dtype)
    if dtype is None:
        raise InvalidArgument("dtype is required when values are present", field=f"{where}.{name}.dtype")
    if dtype.kind != _FAST_KIND[expect]:
        raise InvalidArgument(
            f"dtype {pb.ElementType.Name(msg.dtype)} is not allowed here; expected {_FAST_ALLOWED[expect]}",
            field=f"{where}.{name}.dtype",
        )
    if len(raw) % dtype.itemsize:
        raise InvalidArgument(
            f"raw has {len(raw)} bytes, not a multiple of the {dtype.itemsize}-byte element",
            field=f"{where}.{name}.raw",
        )
    if expect == "bool":
        check_bool_bytes(raw, f"{where}.{name}")
        return len(raw), None, None
    return len(raw) // dtype.itemsize, raw if expect == "float" else None, dtype


def _finite(values: np.ndarray | bytes, dtype: np.dtype | None) -> bool:
    """All finite as float32, which is what experience_from_proto keeps (float64 may overflow)."""
    arr = np.frombuffer(values, dtype=dtype) if isinstance(values, bytes) else values
    if arr.dtype != np.float32:
        with np.errstate(over="ignore"):
            arr = arr.astype(np.float32)
    return bool(np.isfinite(arr).all())


def check_deferred_floats(deferred: DeferredFloats) -> None:
    """Finiteness of the packed float arrays `validate_experience_message` deferred: one numpy
    pass per dtype over all of them; on failure, the first culprit's field is named."""
    by_dtype: dict[np.dtype, list[tuple[bytes, str]]] = {}
    for raw, dtype, field in deferred:
        by_dtype.setdefault(dtype, []).append((raw, field))
    for dtype, members in by_dtype.items():
        if _finite(b"".join(raw for raw, _ in members), dtype):
            continue
        for raw, field in members:
            if not _finite(raw, dtype):
                raise InvalidArgument(non_finite_message(np.frombuffer(raw, dtype=dtype)), field=field)


def _struct_finite(value: struct_pb2.Value | struct_pb2.Struct) -> bool:
    """json_format (MessageToDict) cannot represent NaN/Infinity numbers and raises on them."""
    if isinstance(value, struct_pb2.Struct):
        return all(_struct_finite(v) for v in value.fields.values())
    which = value.WhichOneof("kind")
    if which == "number_value":
        return math.isfinite(value.number_value)
    if which == "struct_value":
        return _struct_finite(value.struct_value)
    if which == "list_value":
        return all(_struct_finite(v) for v in value.list_value.values)
    return True


def _check_structs(msg: pb.Experience, where: str) -> None:
    if msg.HasField("info") and not _struct_finite(msg.info):
        raise InvalidArgument(
            "numbers in info must be finite (JSON has no NaN/Infinity)", field=f"{where}.info"
        )
    messages = msg.messages
    for i, m in enumerate(messages) if messages else ():
        if m.HasField("extra") and not _struct_finite(m.extra):
            raise InvalidArgument(
                "numbers in extra must be finite (JSON has no NaN/Infinity)",
                field=f"{where}.messages[{i}].extra",
            )


def validate_experience_message(
    msg: pb.Experience, where: str = "experience", deferred: DeferredFloats | None = None
) -> None:
    """Reject what experience_from_proto rejects, with the same InvalidArgument field, without
    decoding: lengths come from len(raw) / itemsize, bool arrays are checked with
    bytes.translate, float arrays with one numpy pass (now, or in bulk later when `deferred`
    is given: call check_deferred_floats(deferred) after the last message; a NaN is then
    reported after the other errors of the write rather than in decoding order).

    Struct fields (info, messages[i].extra) are not decoded; numbers in them must be finite,
    since experience_from_proto cannot decode them otherwise (json_format raises ValueError
    there; here it is an InvalidArgument naming the field). About 4 µs for a message with
    tokens and logprobs, ~10x less than decoding.
    """
    has = cast("Callable[[str], bool]", msg.HasField)  # the field names come from _FAST_ARRAYS
    if not has("model_version"):
        raise InvalidArgument(
            "model_version is required (0 for the base model)", field=f"{where}.model_version"
        )
    n = n_chosen = 0
    response: list[tuple[str, int, Any, Any]] = []  # set response arrays: name, length, floats, dtype
    for name, expect in _FAST_ARRAYS:  # decoding, in experience_from_proto's order
        if name == "chosen":  # experience_from_proto decodes info and messages before chosen
            _check_structs(msg, where)
        if not has(name):
            continue
        length, values, dtype = _fast_array(getattr(msg, name), where, name, expect)
        if name == "tokens":
            n = length
        elif name == "chosen":
            n_chosen = length
        elif length and name != "rejected":
            response.append((name, length, values, dtype))
    # From here on: Experience.validate's checks, in its order.
    if msg.model_version < 0:
        raise InvalidArgument("model_version is required and must be >= 0", field=f"{where}.model_version")
    if has("reward"):
        check_reward(msg.reward, f"{where}.reward")
    if n == 0:
        if not msg.messages and n_chosen == 0:
            raise InvalidArgument(
                "an experience needs tokens, messages or chosen/rejected", field=f"{where}.tokens"
            )
        return
    prompt_length = msg.prompt_length
    if not 0 <= prompt_length < n:
        raise InvalidArgument(
            f"prompt_length must be in [0, {n}) for {n} tokens, got {prompt_length}",
            field=f"{where}.prompt_length",
        )
    for name, length, values, dtype in response:
        if length != n - prompt_length:
            raise InvalidArgument(
                f"length {length} does not match the response length {n - prompt_length} "
                f"(len(tokens) {n} - prompt_length {prompt_length})",
                field=f"{where}.{name}",
            )
        if values is None:
            continue
        if deferred is not None and dtype is not None:
            deferred.append((values, dtype, f"{where}.{name}"))
        elif not _finite(values, dtype):
            arr = np.frombuffer(values, dtype=dtype) if isinstance(values, bytes) else values
            raise InvalidArgument(non_finite_message(arr), field=f"{where}.{name}")
