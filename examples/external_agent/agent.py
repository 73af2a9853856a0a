"""An agent outside trinity-grpc writes finished trajectories into the buffer.

It uses nothing but the protos (stubs generated from protos/trinity_grpc/**; here the copies in
gen/, in any language you would run `protoc` or `buf generate` yourself) and plain grpcio:

    python examples/external_agent/agent.py --address 127.0.0.1:50051 --buffer agent_runs

It creates a fifo buffer (a no-op when it already exists), writes two token-level trajectories
(token ids + logprobs + action mask + reward + the model version that generated them) and one
chat-form trajectory (messages + reward), then prints the buffer's Stats as one JSON line.
The idempotency key makes a retried Write (after a timeout, say) store nothing twice.
"""

from __future__ import annotations

import argparse
import json
import struct
import uuid

import grpc
from google.protobuf import json_format

from trinity_grpc.buffer.v1 import buffer_pb2, buffer_pb2_grpc
from trinity_grpc.common.v1 import common_pb2


def packed(fmt: str, values: list) -> bytes:
    """Little-endian raw bytes: the fast path for arrays (no per-element conversion)."""
    return struct.pack(f"<{len(values)}{fmt}", *values)


def token_trajectory(
    prompt: list[int], response: list[int], logprobs: list[float], reward: float, version: int
) -> common_pb2.Experience:
    e = common_pb2.Experience(prompt_length=len(prompt), reward=reward, model_version=version)
    e.tokens.dtype, e.tokens.raw = common_pb2.ELEMENT_TYPE_INT32, packed("i", prompt + response)
    e.logprobs.dtype, e.logprobs.raw = common_pb2.ELEMENT_TYPE_FLOAT32, packed("f", logprobs)
    e.action_mask.dtype, e.action_mask.raw = common_pb2.ELEMENT_TYPE_BOOL, bytes([1] * len(response))
    e.ids.producer, e.ids.task_id = "external-agent", f"task-{uuid.uuid4().hex[:6]}"
    return e


def chat_trajectory(question: str, answer: str, reward: float, version: int) -> common_pb2.Experience:
    e = common_pb2.Experience(reward=reward, model_version=version)
    e.messages.add(role="user", content=question)
    e.messages.add(role="assistant", content=answer)
    e.ids.producer = "external-agent"
    return e


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--buffer", default="agent_runs")
    args = parser.parse_args()
    with grpc.insecure_channel(args.address) as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        spec = buffer_pb2.BufferSpec(name=args.buffer, kind=buffer_pb2.BUFFER_KIND_FIFO)
        stub.CreateBuffer(buffer_pb2.CreateBufferRequest(spec=spec), timeout=10)
        experiences = [
            token_trajectory([1, 2, 3], [7, 8], [-0.1, -0.2], reward=1.0, version=2),
            token_trajectory([1, 2], [9, 9, 9], [-0.3, -0.1, -0.5], reward=0.0, version=2),
            chat_trajectory("What is 2 + 2?", "4", reward=1.0, version=3),
        ]
        request = buffer_pb2.WriteRequest(
            buffer=args.buffer, idempotency_key=f"agent-{uuid.uuid4()}", experiences=experiences
        )
        stub.Write(request, timeout=10)
        stub.Write(request, timeout=10)  # a retry: stores nothing (duplicate=True)
        stats = stub.Stats(buffer_pb2.StatsRequest(buffer=args.buffer), timeout=10)
    print(
        json.dumps(
            json_format.MessageToDict(
                stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
        )
    )


if __name__ == "__main__":
    main()
