"""Typed async client of the buffer service (used by the trainer, the explorer and agents).

    async with await BufferClient.connect("127.0.0.1:50051") as buf:
        await buf.write("experience_buffer", experiences, idempotency_key="explorer-0/step-3")
        batch = await buf.read("experience_buffer", 256, max_wait=5.0)
        ...  # train on batch.experiences
        await buf.ack(batch.lease_id)

Experiences go in and come out as services.common.experience.Experience (numpy arrays); pass
`raw=True` to read/scan to get the protobuf messages instead. Errors are the domain errors of
services.common.errors (InvalidArgument with the field, NotFound, ResourceExhausted, ...).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from services.buffer.convert import KIND_FROM_PROTO, KIND_TO_PROTO, serialize, struct_of, write_request_bytes
from services.buffer.types import BufferSpec, Stats, TaskBatch
from services.common.client import ServiceClient, error_from_rpc
from services.common.experience import Experience
from services.common.wire import experience_from_proto, experience_to_proto, struct_to_dict, task_from_proto
from trinity_grpc.buffer.v1 import buffer_pb2 as bpb
from trinity_grpc.buffer.v1 import buffer_pb2_grpc
from trinity_grpc.common.v1 import common_pb2 as pb


@dataclass
class Batch:
    lease_id: str
    experiences: list[Any]  # Experience, or pb.Experience with raw=True
    end_of_data: bool
    lease_expires_at: float = 0.0


def _batch(msg: bpb.ReadResponse, raw: bool) -> Batch:
    exps = list(msg.experiences) if raw else [experience_from_proto(e) for e in msg.experiences]
    return Batch(msg.lease_id, exps, msg.end_of_data, msg.lease_expires_at)


def _serialized(exps: Sequence[Experience | pb.Experience]) -> list[bytes]:
    return [(e if isinstance(e, pb.Experience) else experience_to_proto(e)).SerializeToString() for e in exps]


class BufferClient(ServiceClient):
    stub_class = buffer_pb2_grpc.BufferServiceStub

    def __init__(self, channel: Any, **kwargs: Any) -> None:
        super().__init__(channel, **kwargs)
        # Write sends a hand-built WriteRequest (convert.write_request_bytes): serializing the
        # experiences one by one and concatenating is ~10x cheaper than building and
        # serializing one ~1 MB WriteRequest.
        self._stub.Write = channel.unary_unary(
            "/trinity_grpc.buffer.v1.BufferService/Write",
            request_serializer=serialize,
            response_deserializer=bpb.WriteResponse.FromString,
            _registered_method=True,
        )

    async def create_buffer(self, name: str, kind: str, **options: Any) -> bool:
        """Create a buffer (kind: taskset, fifo, priority, table; options: StorageConfig keys)."""
        spec = bpb.BufferSpec(name=name, kind=KIND_TO_PROTO[kind], options=struct_of(options))
        return bool((await self._call("CreateBuffer", bpb.CreateBufferRequest(spec=spec))).created)

    async def list_buffers(self) -> list[BufferSpec]:
        r = await self._call("ListBuffers", bpb.ListBuffersRequest())
        return [BufferSpec(b.name, KIND_FROM_PROTO[b.kind], struct_to_dict(b.options)) for b in r.buffers]

    async def write(
        self,
        buffer: str,
        experiences: Sequence[Experience | pb.Experience],
        *,
        idempotency_key: str = "",
        writer_id: str = "",
        timeout: float | None = None,
    ) -> bpb.WriteResponse:
        """Store all or nothing; retried on UNAVAILABLE only when an idempotency key makes that safe."""
        req = write_request_bytes(buffer, idempotency_key, writer_id, _serialized(experiences))
        return await self._call("Write", req, timeout=timeout, retry=bool(idempotency_key))

    async def read(
        self,
        buffer: str,
        batch_size: int,
        *,
        max_wait: float = -1.0,
        lease_s: float = 0.0,
        reader_id: str = "",
        min_model_version: int = 0,
        raw: bool = False,
        timeout: float | None = None,
    ) -> Batch:
        """Lease up to batch_size experiences, waiting up to max_wait s (negative: the buffer's max_read_timeout)."""
        req = bpb.ReadRequest(
            buffer=buffer,
            batch_size=batch_size,
            max_wait_s=max_wait,
            lease_s=lease_s,
            reader_id=reader_id,
            min_model_version=min_model_version,
        )
        if timeout is None and max_wait >= 0:
            timeout = max(self.timeout, max_wait + 5.0)
        return _batch(await self._call("Read", req, timeout=timeout, retry=False), raw)

    async def stream_read(
        self,
        buffer: str,
        batch_size: int,
        *,
        max_wait: float = 1.0,
        lease_s: float = 0.0,
        reader_id: str = "",
        min_model_version: int = 0,
        raw: bool = False,
    ) -> AsyncIterator[Batch]:
        """Batches until end of data (or until the caller stops iterating); ack each one."""
        req = bpb.StreamReadRequest(
            read=bpb.ReadRequest(
                buffer=buffer,
                batch_size=batch_size,
                max_wait_s=max_wait,
                lease_s=lease_s,
                reader_id=reader_id,
                min_model_version=min_model_version,
            )
        )
        call = self._stub.StreamRead(req, metadata=self._metadata())
        try:
            async for msg in call:
                yield _batch(msg.batch, raw)
        except Exception as exc:  # grpc.aio.AioRpcError
            if hasattr(exc, "code"):
                raise error_from_rpc(exc, "StreamRead") from None  # type: ignore[arg-type]
            raise
        finally:
            call.cancel()

    async def ack(self, lease_id: str) -> int:
        return int((await self._call("Ack", bpb.AckRequest(lease_id=lease_id))).acked)

    async def nack(self, lease_id: str) -> int:
        return int((await self._call("Nack", bpb.NackRequest(lease_id=lease_id))).returned)

    async def nack_reader(self, buffer: str, reader_id: str) -> int:
        """Give back every lease `reader_id` holds in `buffer` (a restarted reader's first call);
        returns the number of items made readable again."""
        req = bpb.NackRequest(reader_id=reader_id, buffer=buffer)
        return int((await self._call("Nack", req)).returned)

    async def read_tasks(
        self,
        taskset: str,
        batch_size: int,
        *,
        reader_id: str = "",
        rewind: bool = False,
        repeat_last: bool = False,
        extend: bool = False,
    ) -> TaskBatch:
        req = bpb.ReadTasksRequest(
            taskset=taskset,
            batch_size=batch_size,
            reader_id=reader_id,
            rewind=rewind,
            repeat_last=repeat_last,
            extend=extend,
        )
        r = await self._call("ReadTasks", req, retry=False)
        return TaskBatch(
            [task_from_proto(t) for t in r.tasks], int(r.epoch), int(r.batch_index), r.end_of_data
        )

    async def report_task_feedback(self, taskset: str, pass_rates: dict[str, float]) -> None:
        fb = [bpb.TaskFeedback(task_id=t, pass_rate=p) for t, p in pass_rates.items()]
        await self._call("ReportTaskFeedback", bpb.ReportTaskFeedbackRequest(taskset=taskset, feedback=fb))

    async def scan_table(
        self, buffer: str, offset: int = 0, limit: int = 256, *, raw: bool = False
    ) -> tuple[list[Any], int]:
        """Rows from `offset` and the offset of the next ones."""
        r = await self._call("ScanTable", bpb.ScanTableRequest(buffer=buffer, offset=offset, limit=limit))
        exps = list(r.experiences) if raw else [experience_from_proto(e) for e in r.experiences]
        return exps, int(r.next_offset)

    async def open_writer(self, buffer: str, writer_id: str) -> None:
        await self._call("OpenWriter", bpb.OpenWriterRequest(buffer=buffer, writer_id=writer_id))

    async def close_writer(self, buffer: str, writer_id: str) -> None:
        await self._call("CloseWriter", bpb.CloseWriterRequest(buffer=buffer, writer_id=writer_id))

    async def stats(self, buffer: str) -> Stats:
        r = await self._call("Stats", bpb.StatsRequest(buffer=buffer))
        return Stats(
            r.buffer,
            KIND_FROM_PROTO.get(r.kind, "unspecified"),
            r.depth,
            r.leased,
            r.written,
            r.read,
            r.acked,
            r.dropped,
            dict(r.per_model_version),
            r.oldest_item_age_s,
            r.end_of_data,
        )

    async def get_info(self) -> Any:
        return (await self._call("GetInfo", bpb.GetInfoRequest())).info
