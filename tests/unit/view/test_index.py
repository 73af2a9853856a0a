"""Pure parts of the viewer's index: the trainer's row keys and Array lengths without decoding."""

from __future__ import annotations

import numpy as np

from services.common.experience import Experience
from services.common.wire import experience_to_proto
from services.trainer.ports import experience_key
from services.view.index import array_length, split_key
from trinity_grpc.common.v1 import common_pb2 as pb


def test_split_key_reads_the_trainers_keys_back() -> None:
    exp = Experience(
        tokens=np.zeros(3, np.int32),
        prompt_length=1,
        model_version=0,
        task_id="gsm8k/12",
        run_id=3,
        batch_id=7,
    )
    assert split_key(experience_key(exp)) == (7, "gsm8k/12", 3)
    exp.producer = "explorer-2"
    assert split_key(experience_key(exp)) == (7, "gsm8k/12", 3)
    assert split_key("x/1/2") is None
    assert split_key("5") is None


def test_array_length_counts_elements_of_every_representation() -> None:
    msg = experience_to_proto(
        Experience(
            tokens=np.arange(9, dtype=np.int64),
            prompt_length=2,
            model_version=0,
            action_mask=np.ones(7, bool),
        )
    )
    assert array_length(msg.tokens) == 9
    assert array_length(msg.action_mask) == 7
    assert array_length(pb.Array(dtype=pb.ELEMENT_TYPE_INT32, int_values=[1, 2, 3])) == 3
    assert array_length(pb.Array(dtype=pb.ELEMENT_TYPE_FLOAT32, raw=np.zeros(5, "<f4").tobytes())) == 5
    assert array_length(pb.Array()) == 0
