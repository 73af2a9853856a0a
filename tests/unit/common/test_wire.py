"""Experience <-> protobuf: the fast raw-bytes path, the list path for other languages, and
validation that names the field."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import InvalidArgument
from services.common.experience import ChatMessage, Experience
from services.common.wire import experience_from_proto, experience_to_proto, task_from_proto, task_to_proto
from trinity_grpc.common.v1 import common_pb2 as pb


def make_exp(prompt: int = 3, response: int = 4) -> Experience:
    n = prompt + response
    return Experience(
        tokens=np.arange(n, dtype=np.int32),
        prompt_length=prompt,
        model_version=2,
        reward=0.5,
        logprobs=-np.linspace(0.1, 1.0, response, dtype=np.float32),
        action_mask=np.array([1, 0] * (response // 2) + [1] * (response % 2), dtype=bool),
        task_id="t1",
        group_id="g",
        metrics={"acc": 1.0},
        info={"answer": "7"},
        messages=[ChatMessage("user", "hi")],
    )


def roundtrip(exp: Experience) -> Experience:
    return experience_from_proto(pb.Experience.FromString(experience_to_proto(exp).SerializeToString()))


def test_roundtrip_keeps_arrays_bit_for_bit() -> None:
    exp = make_exp()
    back = roundtrip(exp)
    assert back.tokens.tolist() == exp.tokens.tolist()
    assert back.logprobs.tobytes() == exp.logprobs.tobytes()
    assert back.action_mask.tolist() == exp.action_mask.tolist()
    assert (back.reward, back.model_version, back.task_id, back.info, back.metrics) == (
        0.5,
        2,
        "t1",
        {"answer": "7"},
        {"acc": 1.0},
    )
    assert back.messages[0].content == "hi"


@settings(max_examples=50, deadline=None)
@given(prompt=st.integers(0, 50), response=st.integers(1, 50), reward=st.floats(-1e6, 1e6))
def test_roundtrip_property(prompt: int, response: int, reward: float) -> None:
    exp = make_exp(prompt, response)
    exp.reward = reward
    back = roundtrip(exp)
    assert back.response_length == response and back.reward == reward


def test_list_values_are_accepted_for_callers_without_byte_packing() -> None:
    msg = pb.Experience(prompt_length=1, model_version=0, reward=1.0)
    msg.tokens.dtype = pb.ELEMENT_TYPE_INT64
    msg.tokens.int_values.extend([5, 6, 7])
    msg.logprobs.dtype = pb.ELEMENT_TYPE_FLOAT32
    msg.logprobs.float_values.extend([-0.5, -0.25])
    exp = experience_from_proto(msg)
    assert exp.tokens.tolist() == [5, 6, 7]
    assert exp.logprobs.tolist() == [-0.5, -0.25]


def bad(mutate) -> str:  # type: ignore[no-untyped-def]
    msg = experience_to_proto(make_exp())
    mutate(msg)
    with pytest.raises(InvalidArgument) as info:
        experience_from_proto(msg, "experiences[3]")
    return info.value.field


def test_validation_names_the_field() -> None:
    assert bad(lambda m: m.ClearField("model_version")) == "experiences[3].model_version"
    assert bad(lambda m: setattr(m, "reward", math.nan)) == "experiences[3].reward"
    assert bad(lambda m: setattr(m, "prompt_length", 7)) == "experiences[3].prompt_length"
    assert bad(lambda m: setattr(m.logprobs, "raw", m.logprobs.raw[:-4])) == "experiences[3].logprobs"
    assert bad(lambda m: setattr(m.logprobs, "raw", m.logprobs.raw[:-1])) == "experiences[3].logprobs.raw"
    assert bad(lambda m: setattr(m.tokens, "dtype", pb.ELEMENT_TYPE_FLOAT32)) == "experiences[3].tokens.dtype"
    assert (
        bad(lambda m: setattr(m.tokens, "dtype", pb.ELEMENT_TYPE_UNSPECIFIED))
        == "experiences[3].tokens.dtype"
    )
    assert bad(lambda m: m.tokens.int_values.append(1)) == "experiences[3].tokens"
    assert bad(lambda m: setattr(m.action_mask, "raw", b"\x02" * 4)) == "experiences[3].action_mask"


def test_nan_logprobs_are_rejected() -> None:
    exp = make_exp()
    exp.logprobs[1] = np.nan
    with pytest.raises(InvalidArgument) as info:
        roundtrip(exp)
    assert info.value.field == "experience.logprobs"


def test_task_roundtrip() -> None:
    from services.common.experience import Task

    task = Task(
        workflow="math_workflow",
        raw_task={"q": "1+1", "a": 2},
        rollout_args={"temperature": 1.0},
        task_id="7",
        index=7,
        taskset="train",
        repeat_times=8,
    )
    back = task_from_proto(pb.Task.FromString(task_to_proto(task).SerializeToString()))
    assert back == Task(
        workflow="math_workflow",
        raw_task={"q": "1+1", "a": 2.0},
        rollout_args={"temperature": 1.0},
        task_id="7",
        index=7,
        taskset="train",
        repeat_times=8,
    )
