"""gRPC servicer of the buffer: converts messages and calls BufferCore (services/buffer/core.py).

Deadlines: a Write waits for room at most until shortly before the caller's deadline, so a
full fifo answers RESOURCE_EXHAUSTED rather than letting the call time out; a Read returns its
partial batch before the deadline for the same reason (nothing is lost to a timed-out call).
StreamRead is flow-controlled by HTTP/2: the next batch is claimed only after the previous one
was handed to the transport, and gRPC holds the writer while the client's window is full.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc

from services.buffer.convert import (
    read_response_bytes,
    serialize,
    spec_from_proto,
    spec_to_proto,
    stats_to_proto,
    stream_read_response_bytes,
)
from services.buffer.core import BufferCore
from services.buffer.metrics import export as export_metrics
from services.buffer.specs import data_dir, defaults_from_config, mixes_from_config, specs_from_config
from services.buffer.types import ReadResult
from services.common.config.schema import TrinityConfig
from services.common.errors import ResourceExhausted
from services.common.limits import MIB, advice, limit_bytes
from services.common.logging import get_logger
from services.common.monitor import every, make_monitor
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

    async def _read(self, req: bpb.ReadRequest, context: Any) -> ReadResult:
        wait = req.max_wait_s if req.max_wait_s >= 0 else self.core.items(req.buffer).max_read_timeout
        return await self.core.read(
            req.buffer,
            req.batch_size,
            max_wait=_budget(context, wait) or 0.0,
            lease_s=req.lease_s,
            min_model_version=req.min_model_version,
            reader_id=req.reader_id,
        )

    async def _reply(self, batch: ReadResult, method: str, *, stream: bool = False) -> bytes:
        """The serialized (Stream)ReadResponse. One over services.max_message_mb would fail inside
        gRPC after the lease was taken, its id never reaching the reader: the rows go back at once
        and the reader is told the size and to ask for fewer."""
        reply = read_response_bytes(batch)
        reply = stream_read_response_bytes(reply) if stream else reply
        limit = limit_bytes(self.server.services.max_message_mb) if self.server is not None else None
        if limit is not None and len(reply) > limit and batch.lease_id:
            await self.core.nack(batch.lease_id)
            raise ResourceExhausted(
                f"the {len(batch.payloads)} experiences read come to {len(reply):,} bytes, over the limit "
                f"of {limit:,} bytes (services.max_message_mb = {limit // MIB}); they were given back: "
                f"{advice(method)}",
                field="batch_size",
            )
        return reply

    # Returns the serialized reply, not a ReadResponse: add_to_server registers Read with a pass-through
    # serializer, so the stored payloads are never parsed and re-encoded (hence the override).
    async def Read(self, request: bpb.ReadRequest, context: Any) -> bytes:  # type: ignore[override]  # noqa: N802
        """A serialized ReadResponse: the stored experiences go out as stored (see add_to_server)."""
        return await self._reply(await self._read(request, context), "Read")

    async def StreamRead(  # type: ignore[override]  # noqa: N802
        self, request: bpb.StreamReadRequest, context: Any
    ) -> AsyncIterator[bytes]:  # serialized ReadResponses, as Read (see add_to_server)
        while True:
            batch = await self._read(request.read, context)
            if batch.payloads or batch.end_of_data:
                yield await self._reply(batch, "StreamRead", stream=True)
            if batch.end_of_data:
                return

    async def Ack(self, request: bpb.AckRequest, context: Any) -> bpb.AckResponse:  # noqa: N802
        return bpb.AckResponse(acked=await self.core.ack(request.lease_id))

    async def Nack(self, request: bpb.NackRequest, context: Any) -> bpb.NackResponse:  # noqa: N802
        returned = await self.core.nack(request.lease_id, reader_id=request.reader_id, buffer=request.buffer)
        return bpb.NackResponse(returned=returned)

    async def ReadTasks(self, request: bpb.ReadTasksRequest, context: Any) -> bpb.ReadTasksResponse:  # noqa: N802
        b = await self.core.read_tasks(
            request.taskset,
            request.batch_size,
            reader_id=request.reader_id,
            rewind=request.rewind,
            repeat_last=request.repeat_last,
            extend=request.extend,
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


class _BytesResponses:
    """Stands in for the grpc server while the generated `add_BufferServiceServicer_to_server`
    registers its handlers, and swaps in a serializer that passes bytes through for the RPCs
    whose servicer methods return hand-built messages (Read, StreamRead): the generated code
    offers no other hook for the serializer."""

    BYTES_OUT = ("Read", "StreamRead")

    def __init__(self, server: Any) -> None:
        self._server = server
        self.registered = False

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Replaced by the handlers registered in add_registered_method_handlers."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        handlers = dict(handlers)
        for name in self.BYTES_OUT:
            h = handlers[name]
            make = (
                grpc.unary_stream_rpc_method_handler
                if h.response_streaming
                else grpc.unary_unary_rpc_method_handler
            )
            behavior = h.unary_stream if h.response_streaming else h.unary_unary
            handlers[name] = make(behavior, h.request_deserializer, serialize)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        self._server.add_registered_method_handlers(service, handlers)
        self.registered = True


def add_to_server(servicer: BufferServicer, server: Any) -> None:
    """add_BufferServiceServicer_to_server, with Read/StreamRead sending bytes as they are."""
    proxy = _BytesResponses(server)
    # the proxy stands in for the server: the generated function only calls add_registered_method_handlers
    buffer_pb2_grpc.add_BufferServiceServicer_to_server(servicer, cast("grpc.aio.Server", proxy))
    if not proxy.registered:  # generated code of another grpcio-tools release
        raise RuntimeError("add_BufferServiceServicer_to_server did not call add_registered_method_handlers")


async def serve(cfg: TrinityConfig) -> None:
    """Open every configured buffer, serve until SIGTERM/SIGINT, then close the files."""
    core = BufferCore(data_dir(cfg), defaults_from_config(cfg))
    await core.start(specs_from_config(cfg), mixes_from_config(cfg))
    server = ServiceServer("buffer", cfg.services)
    server.add(add_to_server, BufferServicer(core, server), SERVICE_NAME)
    export_metrics(server.metrics, core)
    server.on_shutdown(core.close)
    monitor = make_monitor(cfg, "buffer")

    async def counters() -> dict[str, float]:
        metrics: dict[str, float] = {}
        for name in sorted(core.buffers):
            st = await core.stats(name)
            for key in ("depth", "leased", "written", "read", "acked", "dropped"):
                metrics[f"buffer/{name}/{key}"] = float(getattr(st, key))
        return metrics

    sampler = asyncio.create_task(every(monitor, cfg.monitor.interval_s, counters))

    async def stop_sampler() -> None:
        sampler.cancel()
        monitor.close()

    server.on_shutdown(stop_sampler)
    # Everything built so far (modules, SQLAlchemy, protobuf descriptors) lives as long as the
    # process: keep it out of the cyclic GC's full collections, which otherwise walk all of it
    # every few batches (they were ~10% of a write's time).
    gc.freeze()
    try:
        port = await server.start()
        log.info("buffer_ready", port=port, data_dir=core.data_dir, buffers=sorted(core.buffers))
        await server.wait()
    finally:
        await core.close()
