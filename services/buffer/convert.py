"""Messages <-> core values for the buffer servicer and client (protobuf only, no grpc)."""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2

from services.buffer.types import BufferSpec, ReadResult, Stats
from services.common.wire import dict_to_struct, struct_to_dict
from trinity_grpc.buffer.v1 import buffer_pb2 as bpb

KIND_TO_PROTO = {
    "taskset": bpb.BUFFER_KIND_TASKSET,
    "fifo": bpb.BUFFER_KIND_FIFO,
    "priority": bpb.BUFFER_KIND_PRIORITY,
    "table": bpb.BUFFER_KIND_TABLE,
}
KIND_FROM_PROTO = {v: k for k, v in KIND_TO_PROTO.items()}


def spec_from_proto(msg: bpb.BufferSpec) -> BufferSpec:
    return BufferSpec(
        msg.name, KIND_FROM_PROTO.get(msg.kind, "unspecified"), _plain(struct_to_dict(msg.options))
    )


def spec_to_proto(spec: BufferSpec, out: bpb.BufferSpec | None = None) -> bpb.BufferSpec:
    msg = out if out is not None else bpb.BufferSpec()
    msg.name, msg.kind = spec.name, KIND_TO_PROTO[spec.kind]
    dict_to_struct(spec.options, msg.options)
    return msg


def _plain(value: Any) -> Any:
    """Struct numbers are doubles: give integral ones back as ints (capacity: 8.0 -> 8)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_response(r: ReadResult) -> bpb.ReadResponse:
    """Build the response from the stored Experience bytes in one parse (field 2 = experiences)."""
    msg = bpb.ReadResponse(
        lease_id=r.lease_id, end_of_data=r.end_of_data, lease_expires_at=r.lease_expires_at
    )
    if r.payloads:
        msg.MergeFromString(b"".join(b"\x12" + _varint(len(p)) + p for p in r.payloads))
    return msg


def stats_to_proto(st: Stats) -> bpb.StatsResponse:
    return bpb.StatsResponse(
        buffer=st.name,
        kind=KIND_TO_PROTO[st.kind],
        depth=st.depth,
        leased=st.leased,
        written=st.written,
        read=st.read,
        acked=st.acked,
        per_model_version=st.per_model_version,
        oldest_item_age_s=st.oldest_item_age_s,
        dropped=st.dropped,
        end_of_data=st.end_of_data,
    )


def struct_of(data: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    dict_to_struct(data, out)
    return out
