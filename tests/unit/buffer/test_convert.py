"""The hand-built messages of the hot buffer RPCs (services/buffer/convert.py) parse, with the
real protobuf parser, to the messages protobuf itself would build."""

from __future__ import annotations

import numpy as np
import pytest

from services.buffer.convert import (
    _varint,
    read_response_bytes,
    serialize,
    stream_read_response_bytes,
    write_request_bytes,
)
from services.buffer.types import ReadResult
from services.common.experience import Experience
from services.common.wire import experience_to_proto
from trinity_grpc.buffer.v1 import buffer_pb2 as bpb
from trinity_grpc.common.v1 import common_pb2 as pb


def exps(sizes: list[int]) -> list[pb.Experience]:
    """Experiences whose serialized sizes straddle the 1/2/3-byte varint length boundaries."""
    return [
        experience_to_proto(
            Experience(tokens=np.arange(n, dtype=np.int32), prompt_length=0, model_version=i, task_id=f"t{i}")
        )
        for i, n in enumerate(sizes)
    ]


SIZES = [1, 25, 30, 31, 32, 4000, 5000, 300_000]


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, 2**21, 2**35])
def test_varint_matches_protobuf(n: int) -> None:
    msg = pb.Array()
    msg.int_values.append(n)  # packed repeated int64: tag, length, varint(n)
    assert msg.SerializeToString().endswith(_varint(n))


@pytest.mark.parametrize(
    "end,expires,lease", [(False, 1.7e9 + 0.25, "buf:abc"), (True, 0.0, ""), (False, 0.0, "é")]
)
def test_read_response_bytes_parse_to_the_same_message(end: bool, expires: float, lease: str) -> None:
    items = exps(SIZES)
    payloads = [m.SerializeToString() for m in items]
    got = bpb.ReadResponse.FromString(read_response_bytes(ReadResult(lease, payloads, end, expires)))
    want = bpb.ReadResponse(lease_id=lease, experiences=items, end_of_data=end, lease_expires_at=expires)
    assert got == want
    assert [e.SerializeToString() for e in got.experiences] == payloads


def test_empty_read_and_stream_wrapper() -> None:
    empty = read_response_bytes(ReadResult("", [], False, 0.0))
    assert empty == b"" and bpb.ReadResponse.FromString(empty) == bpb.ReadResponse()
    batch = read_response_bytes(
        ReadResult("b:1", [m.SerializeToString() for m in exps([3, 300_000])], True, 5.5)
    )
    streamed = bpb.StreamReadResponse.FromString(stream_read_response_bytes(batch))
    assert streamed.batch == bpb.ReadResponse.FromString(batch)
    assert streamed.batch.end_of_data and streamed.batch.lease_expires_at == 5.5


@pytest.mark.parametrize("key,writer", [("", ""), ("explorer-0/step-3", "w1")])
def test_write_request_bytes_parse_to_the_same_message(key: str, writer: str) -> None:
    items = exps(SIZES)
    raw = write_request_bytes("experience_buffer", key, writer, [m.SerializeToString() for m in items])
    want = bpb.WriteRequest(
        buffer="experience_buffer", idempotency_key=key, writer_id=writer, experiences=items
    )
    assert bpb.WriteRequest.FromString(raw) == want
    assert serialize(raw) is raw and serialize(want) == want.SerializeToString()
