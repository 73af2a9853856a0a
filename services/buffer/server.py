"""gRPC servicer of the buffer: converts messages and calls BufferCore (services/buffer/core.py).

Deadlines: a Write waits for room at most until shortly before the caller's deadline, so a
full fifo answers RESOURCE_EXHAUSTED rather than letting the call time out; a Read returns its
partial batch before the deadline for the same reason (nothing is lost to a timed-out call).
StreamRead is flow-controlled by HTTP/2: the next batch is claimed only after the previous one
was handed to the transport, and gRPC holds the writer while the client's window is full.
"""

from __future__ import annotations

from typing import Any

from services.buffer.convert import read_response, spec_from_proto, spec_to_proto, stats_to_proto
from services.buffer.core import BufferCore
from services.buffer.specs import data_dir, defaults_from_config, specs_from_config
from services.common.logging import get_logger
from services.common.server import ServiceServer
from services.common.version import __version__
from services.common.wire import task_to_proto
from trinity_grpc.buffer.v1 import buffer_pb2 as bpb
from trinity_grpc.buffer.v1 import buffer_pb2_grpc

SERVICE_NAME = "trinity_grpc.buffer.v1.BufferService"
DEADLINE_MARGIN_S = 0.2  # answer this long before the caller's deadline
log = get_logger("buffer")


def _budget(context: Any, wanted: float | None) -> float | None:
    """`wanted` seconds (None: unbounded), cut to the caller's remaining deadline minus a margin."""
    remaining = context.time_remaining()
    if remaining is None:
        return wanted
    cap = max(0.0, remaining - DEADLINE_MARGIN_S)
    return cap if wanted is None or wanted < 0 else min(wanted, cap)


class BufferServicer(buffer_pb2_grpc.BufferServiceServicer):
    def __init__(self, core: BufferCore, server: ServiceServer | None = None) -> None:
        self.core = core
        self.server = server

    async def CreateBuffer(self, request: bpb.CreateBufferRequest, context: Any) -> bpb.CreateBufferResponse:  # noqa: N802
        created = await self.core.create(spec_from_proto(request.spec))
        return bpb.CreateBufferResponse(created=created)

    async def ListBuffers(self, request: bpb.ListBuffersRequest, context: Any) -> bpb.ListBuffersResponse:  # noqa: N802
        response = bpb.ListBuffersResponse()
        for spec in self.core.list():
            spec_to_proto(spec, response.buffers.add())
        return response

    async def Write(self, request: bpb.WriteRequest, context: Any) -> bpb.WriteResponse:  # noqa: N802
        r = await self.core.write(
            request.buffer,
            request.experiences,
            key=request.idempotency_key,
            writer_id=request.writer_id,
            timeout=_budget(context, None),
        )
        return bpb.WriteResponse(written=r.written, duplicate=r.duplicate, evicted=r.evicted)

    async def _read(self, req: bpb.ReadRequest, context: Any) -> bpb.ReadResponse:
        wait = req.max_wait_s if req.max_wait_s >= 0 else self.core.items(req.buffer).max_read_timeout
        r = await self.core.read(
            req.buffer,
            req.batch_size,
            max_wait=_budget(context, wait) or 0.0,
            lease_s=req.lease_s,
            min_model_version=req.min_model_version,
        )
        return read_response(r)

    async def Read(self, request: bpb.ReadRequest, context: Any) -> bpb.ReadResponse:  # noqa: N802
        return await self._read(request, context)

    async def StreamRead(self, request: bpb.StreamReadRequest, context: Any):  # type: ignore[no-untyped-def]  # noqa: N802
        while True:
            batch = await self._read(request.read, context)
            if batch.experiences or batch.end_of_data:
                yield bpb.StreamReadResponse(batch=batch)
            if batch.end_of_data:
                return

    async def Ack(self, request: bpb.AckRequest, context: Any) -> bpb.AckResponse:  # noqa: N802
        return bpb.AckResponse(acked=await self.core.ack(request.lease_id))

    async def Nack(self, request: bpb.NackRequest, context: Any) -> bpb.NackResponse:  # noqa: N802
        return bpb.NackResponse(returned=await self.core.nack(request.lease_id))

    async def ReadTasks(self, request: bpb.ReadTasksRequest, context: Any) -> bpb.ReadTasksResponse:  # noqa: N802
        b = await self.core.read_tasks(
            request.taskset, request.batch_size, reader_id=request.reader_id, rewind=request.rewind
        )
        response = bpb.ReadTasksResponse(epoch=b.epoch, batch_index=b.batch_index, end_of_data=b.end_of_data)
        for task in b.tasks:
            task_to_proto(task, response.tasks.add())
        return response

    async def ReportTaskFeedback(
        self, request: bpb.ReportTaskFeedbackRequest, context: Any
    ) -> bpb.ReportTaskFeedbackResponse:  # noqa: N802
        await self.core.report_feedback(request.taskset, [(f.task_id, f.pass_rate) for f in request.feedback])
        return bpb.ReportTaskFeedbackResponse()

    async def ScanTable(self, request: bpb.ScanTableRequest, context: Any) -> bpb.ScanTableResponse:  # noqa: N802
        payloads, next_offset = await self.core.scan(request.buffer, request.offset, request.limit)
        response = bpb.ScanTableResponse(next_offset=next_offset)
        for p in payloads:
            response.experiences.add().MergeFromString(p)
        return response

    async def OpenWriter(self, request: bpb.OpenWriterRequest, context: Any) -> bpb.OpenWriterResponse:  # noqa: N802
        await self.core.open_writer(request.buffer, request.writer_id)
        return bpb.OpenWriterResponse()

    async def CloseWriter(self, request: bpb.CloseWriterRequest, context: Any) -> bpb.CloseWriterResponse:  # noqa: N802
        await self.core.close_writer(request.buffer, request.writer_id)
        return bpb.CloseWriterResponse()

    async def Stats(self, request: bpb.StatsRequest, context: Any) -> bpb.StatsResponse:  # noqa: N802
        return stats_to_proto(await self.core.stats(request.buffer))

    async def GetInfo(self, request: bpb.GetInfoRequest, context: Any) -> bpb.GetInfoResponse:  # noqa: N802
        assert self.server is not None
        return bpb.GetInfoResponse(info=self.server.info(__version__, stats=self.core.summary()))


async def serve(cfg: Any) -> None:
    """Open every configured buffer, serve until SIGTERM/SIGINT, then close the files."""
    core = BufferCore(data_dir(cfg), defaults_from_config(cfg))
    await core.start(specs_from_config(cfg))
    server = ServiceServer("buffer", cfg.services)
    server.add(
        buffer_pb2_grpc.add_BufferServiceServicer_to_server, BufferServicer(core, server), SERVICE_NAME
    )
    server.on_shutdown(core.close)
    try:
        port = await server.start()
        log.info("buffer_ready", port=port, data_dir=core.data_dir, buffers=sorted(core.buffers))
        await server.wait()
    finally:
        await core.close()
