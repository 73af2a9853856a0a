"""wire.validate_experience_message (no decoding) rejects exactly what experience_from_proto
rejects, naming the same field, and accepts what it accepts."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.common.experience import ChatMessage, Experience
from services.common.wire import (
    check_deferred_floats,
    experience_from_proto,
    experience_to_proto,
    validate_experience_message,
)
from trinity_grpc.common.v1 import common_pb2 as pb

F32, F64, I32, I64, BOOL = (
    pb.ELEMENT_TYPE_FLOAT32,
    pb.ELEMENT_TYPE_FLOAT64,
    pb.ELEMENT_TYPE_INT32,
    pb.ELEMENT_TYPE_INT64,
    pb.ELEMENT_TYPE_BOOL,
)


def good(n: int = 8, prompt: int = 3) -> pb.Experience:
    return experience_to_proto(
        Experience(
            tokens=np.arange(n, dtype=np.int32),
            prompt_length=prompt,
            model_version=2,
            reward=0.5,
            logprobs=np.full(n - prompt, -0.25, np.float32),
            action_mask=np.ones(n - prompt, bool),
            advantages=np.linspace(-1, 1, n - prompt).astype(np.float32),
            info={"answer": "42", "score": 1.5, "nested": {"xs": [1, 2.5]}},
            task_id="t",
        )
    )


def edit(fn: Callable[[pb.Experience], object]) -> pb.Experience:
    msg = good()
    fn(msg)
    return msg


def _set(arr: pb.Array, dtype: int, raw: bytes) -> None:
    arr.dtype, arr.raw = dtype, raw


def _nan_info(m: pb.Experience) -> None:
    m.info.update({"x": {"y": [1.0, float("nan")]}})


def _nan_extra(m: pb.Experience) -> None:
    m.messages.add(role="user", content="hi").extra.update({"score": float("inf")})


# (case id, message, field both must name)
BAD: list[tuple[str, pb.Experience, str]] = [
    ("no model_version", edit(lambda m: m.ClearField("model_version")), "e.model_version"),
    ("negative model_version", edit(lambda m: setattr(m, "model_version", -1)), "e.model_version"),
    ("nan reward", edit(lambda m: setattr(m, "reward", float("nan"))), "e.reward"),
    ("inf reward", edit(lambda m: setattr(m, "reward", float("-inf"))), "e.reward"),
    ("tokens float dtype", edit(lambda m: _set(m.tokens, F32, bytes(32))), "e.tokens.dtype"),
    (
        "tokens no dtype",
        edit(lambda m: _set(m.tokens, pb.ELEMENT_TYPE_UNSPECIFIED, bytes(32))),
        "e.tokens.dtype",
    ),
    ("tokens ragged raw", edit(lambda m: _set(m.tokens, I32, bytes(31))), "e.tokens.raw"),
    ("tokens raw and ints", edit(lambda m: m.tokens.int_values.extend([1, 2])), "e.tokens"),
    (
        "tokens floats for int",
        edit(lambda m: (m.tokens.ClearField("raw"), m.tokens.float_values.extend([1.0]))),
        "e.tokens",
    ),
    ("no tokens no messages", edit(lambda m: m.ClearField("tokens")), "e.tokens"),
    ("prompt_length too big", edit(lambda m: setattr(m, "prompt_length", 8)), "e.prompt_length"),
    ("prompt_length negative", edit(lambda m: setattr(m, "prompt_length", -1)), "e.prompt_length"),
    ("logprobs int dtype", edit(lambda m: _set(m.logprobs, I32, bytes(20))), "e.logprobs.dtype"),
    (
        "logprobs too short",
        edit(lambda m: _set(m.logprobs, F32, np.zeros(4, np.float32).tobytes())),
        "e.logprobs",
    ),
    (
        "logprobs nan",
        edit(lambda m: _set(m.logprobs, F32, np.array([0, 0, np.nan, 0, 0], np.float32).tobytes())),
        "e.logprobs",
    ),
    (
        "logprobs f64 overflows f32",
        edit(lambda m: _set(m.logprobs, F64, np.array([0, 0, 1e300, 0, 0]).tobytes())),
        "e.logprobs",
    ),
    (
        "logprobs float_values inf",
        edit(
            lambda m: (
                m.logprobs.ClearField("raw"),
                m.logprobs.float_values.extend([0, 0, 0, float("inf"), 0]),
            )
        ),
        "e.logprobs",
    ),
    (
        "logprobs int_values for float",
        edit(lambda m: (m.logprobs.ClearField("raw"), m.logprobs.int_values.extend([0] * 5))),
        "e.logprobs",
    ),
    (
        "action_mask value 2",
        edit(lambda m: _set(m.action_mask, BOOL, bytes([1, 1, 2, 1, 1]))),
        "e.action_mask",
    ),
    (
        "action_mask int_values 3",
        edit(lambda m: (m.action_mask.ClearField("raw"), m.action_mask.int_values.extend([1, 3, 1, 1, 1]))),
        "e.action_mask",
    ),
    (
        "action_mask int_values 256 (wraps to 0 as uint8)",
        edit(lambda m: (m.action_mask.ClearField("raw"), m.action_mask.int_values.extend([1, 256, 1, 1, 1]))),
        "e.action_mask",
    ),
    (
        "tokens int_values beyond INT32",
        edit(
            lambda m: (m.tokens.ClearField("raw"), m.tokens.int_values.extend([1, 9_999_999_999, *range(6)]))
        ),
        "e.tokens",
    ),
    (
        "chosen int_values below INT32",
        edit(lambda m: (setattr(m.chosen, "dtype", I32), m.chosen.int_values.extend([0, -(2**31) - 1]))),
        "e.chosen",
    ),
    (
        "logprobs float_values overflow FLOAT32",
        edit(lambda m: (m.logprobs.ClearField("raw"), m.logprobs.float_values.extend([0, 1e39, 0, 0, 0]))),
        "e.logprobs",
    ),
    ("reward overflows float32", edit(lambda m: setattr(m, "reward", 1e39)), "e.reward"),
    ("action_mask float dtype", edit(lambda m: _set(m.action_mask, F32, bytes(20))), "e.action_mask.dtype"),
    ("action_mask wrong length", edit(lambda m: _set(m.action_mask, BOOL, bytes([1] * 6))), "e.action_mask"),
    (
        "advantages inf",
        edit(lambda m: _set(m.advantages, F32, np.array([0, np.inf, 0, 0, 0], np.float32).tobytes())),
        "e.advantages",
    ),
    ("returns wrong length", edit(lambda m: _set(m.returns, F32, bytes(8))), "e.returns"),
    (
        "token_level_rewards ragged",
        edit(lambda m: _set(m.token_level_rewards, F64, bytes(12))),
        "e.token_level_rewards.raw",
    ),
    ("chosen float dtype", edit(lambda m: _set(m.chosen, F32, bytes(8))), "e.chosen.dtype"),
    ("rejected ragged", edit(lambda m: _set(m.rejected, I64, bytes(12))), "e.rejected.raw"),
    # decode errors come before the checks of the decoded experience, as in experience_from_proto
    (
        "bad dtype and bad reward",
        edit(lambda m: (_set(m.returns, I32, bytes(20)), setattr(m, "reward", float("nan")))),
        "e.returns.dtype",
    ),
    (
        "bad prompt and nan logprobs",
        edit(
            lambda m: (
                setattr(m, "prompt_length", 99),
                _set(m.logprobs, F32, np.full(5, np.nan, np.float32).tobytes()),
            )
        ),
        "e.prompt_length",
    ),
    (
        "chat-only, bad logprobs",
        edit(
            lambda m: (
                m.ClearField("tokens"),
                m.messages.add(role="user", content="x"),
                _set(m.logprobs, I64, bytes(8)),
            )
        ),
        "e.logprobs.dtype",
    ),
]


@pytest.mark.parametrize("case,msg,field", BAD, ids=[b[0] for b in BAD])
def test_rejects_what_decoding_rejects(case: str, msg: pb.Experience, field: str) -> None:
    with pytest.raises(InvalidArgument) as slow:
        experience_from_proto(msg, "e")
    with pytest.raises(InvalidArgument) as fast:
        validate_experience_message(msg, "e")
    assert slow.value.field == fast.value.field == field
    assert type(slow.value) is type(fast.value)


@pytest.mark.parametrize("fn,field", [(_nan_info, "e.info"), (_nan_extra, "e.messages[0].extra")])
def test_non_finite_struct_numbers_are_rejected_by_both(
    fn: Callable[[pb.Experience], None], field: str
) -> None:
    """json_format cannot decode NaN/Infinity in a Struct; the fast check names the field instead."""
    msg = edit(fn)
    with pytest.raises(ValueError, match="NaN|Infinity"):
        experience_from_proto(msg, "e")
    with pytest.raises(InvalidArgument) as fast:
        validate_experience_message(msg, "e")
    assert fast.value.field == field


def _chat_only() -> pb.Experience:
    return experience_to_proto(
        Experience(
            tokens=np.zeros(0, np.int32),
            prompt_length=0,
            model_version=0,
            messages=[ChatMessage("user", "hi", {"k": [1]})],
        )
    )


def _dpo() -> pb.Experience:
    return experience_to_proto(
        Experience(
            tokens=np.zeros(0, np.int32),
            prompt_length=0,
            model_version=1,
            chosen=np.arange(3),
            rejected=np.arange(4),
        )
    )


def _repeated_scalars() -> pb.Experience:
    m = pb.Experience(model_version=0, prompt_length=1)
    m.tokens.dtype, m.logprobs.dtype, m.action_mask.dtype = I64, F64, BOOL
    m.tokens.int_values.extend([5, 6, 7])
    m.logprobs.float_values.extend([-0.1, -0.2])
    m.action_mask.int_values.extend([1, 0])
    return m


GOOD = [
    ("full", good()),
    ("minimal", experience_to_proto(Experience(tokens=np.arange(2), prompt_length=1, model_version=0))),
    (
        "empty arrays set",
        edit(lambda m: (m.returns.SetInParent(), setattr(m.token_level_rewards, "dtype", F32))),
    ),
    ("float64 logprobs", edit(lambda m: _set(m.logprobs, F64, np.full(5, -1.0).tobytes()))),
    (
        "nan logprobs but no tokens",
        edit(
            lambda m: (
                m.ClearField("tokens"),
                m.messages.add(role="u"),
                _set(m.logprobs, F32, np.full(5, np.nan, np.float32).tobytes()),
            )
        ),
    ),
    ("chat only", _chat_only()),
    ("dpo", _dpo()),
    ("repeated scalars", _repeated_scalars()),
]


@pytest.mark.parametrize("case,msg", GOOD, ids=[g[0] for g in GOOD])
def test_accepts_what_decoding_accepts(case: str, msg: pb.Experience) -> None:
    experience_from_proto(msg, "e")
    validate_experience_message(msg, "e")
    deferred: list = []
    validate_experience_message(msg, "e", deferred)
    check_deferred_floats(deferred)


def test_deferred_float_checks_name_the_culprit() -> None:
    """In bulk mode NaNs are found after the last message, still with the right field."""
    msgs = [good() for _ in range(5)]
    _set(msgs[3].advantages, F32, np.array([0, 0, 0, 0, np.nan], np.float32).tobytes())
    deferred: list = []
    for i, m in enumerate(msgs):
        validate_experience_message(m, f"experiences[{i}]", deferred)
    assert deferred  # nothing raised yet
    with pytest.raises(InvalidArgument) as err:
        check_deferred_floats(deferred)
    assert err.value.field == "experiences[3].advantages"


def _fast_message(msg: pb.Experience, *, bulk: bool) -> str:
    deferred: list = []
    with pytest.raises(InvalidArgument) as err:
        validate_experience_message(msg, "e", deferred if bulk else None)
        check_deferred_floats(deferred)
    return err.value.message


@pytest.mark.parametrize("bulk", [False, True], ids=["now", "deferred"])
def test_value_errors_name_the_index_and_the_value(bulk: bool) -> None:
    big_token = edit(lambda m: (m.tokens.ClearField("raw"), m.tokens.int_values.extend([*range(7), 2**31])))
    assert "int_values[7] = 2147483648 is outside the INT32 range [-2147483648, 2147483647]" in (
        _fast_message(big_token, bulk=bulk)
    )
    f64 = edit(lambda m: _set(m.logprobs, F64, np.array([0, 0, 0, 1e300, 0]).tobytes()))
    assert "element 3 = 1e+300 overflows float32" in _fast_message(f64, bulk=bulk)
    f32 = edit(lambda m: (m.logprobs.ClearField("raw"), m.logprobs.float_values.extend([0, 1e39, 0, 0, 0])))
    assert "element 1 = 1e+39 overflows float32" in _fast_message(f32, bulk=bulk)
    nan = edit(lambda m: _set(m.advantages, F32, np.array([0, 0, 0, 0, np.nan], np.float32).tobytes()))
    assert "element 4 is nan" in _fast_message(nan, bulk=bulk)
    mask = edit(lambda m: _set(m.action_mask, BOOL, bytes([1, 1, 1, 7, 1])))
    assert "element 3 is 7" in _fast_message(mask, bulk=bulk)


def test_int64_takes_what_int32_refuses() -> None:
    msg = edit(lambda m: (m.tokens.ClearField("raw"), m.tokens.int_values.extend([*range(7), 9_999_999_999])))
    msg.tokens.dtype = I64
    validate_experience_message(msg, "e")
    assert experience_from_proto(msg, "e").tokens[-1] == 9_999_999_999
