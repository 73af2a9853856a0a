"""The synchronizer's gRPC servicer: converts messages and calls `core.Synchronizer`.

No torch here (it never carries weights): plan, ledger, liveness and the rendezvous only. The
ledger's durable part lives in `<run dir>/synchronizer/ledger.json` (store.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from services.common import errors
from services.common.config import TrinityConfig
from services.common.logging import get_logger
from services.common.monitor import every, make_monitor
from services.common.server import ServiceServer
from services.common.version import __version__
from services.synchronizer import convert as C
from services.synchronizer.core import Synchronizer
from services.synchronizer.metrics import export as export_metrics
from services.synchronizer.plan import Plan
from services.synchronizer.store import JsonFileStore, ledger_path
from trinity_grpc.synchronizer.v1 import synchronizer_pb2 as pb
from trinity_grpc.synchronizer.v1 import synchronizer_pb2_grpc as pb_grpc

log = get_logger("synchronizer")
SERVICE_NAME = "trinity_grpc.synchronizer.v1.SynchronizerService"


class SynchronizerServicer(pb_grpc.SynchronizerServiceServicer):
    def __init__(
        self, core: Synchronizer, heartbeat_interval_s: float, server: ServiceServer | None = None
    ) -> None:
        self.core = core
        self.heartbeat_interval_s = heartbeat_interval_s
        self.server = server

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.RegisterResponse:  # noqa: N802
        role = C.ROLE_FROM_PB.get(request.role, "")
        latest, last_step = await self.core.register(request.member_id, role)
        log.info("member_registered", member=request.member_id, role=role, last_step=last_step)
        return pb.RegisterResponse(
            current_version=C.version_to_pb(latest),
            last_step=last_step,
            plan=C.plan_to_pb(self.core.plan),
            heartbeat_interval_s=self.heartbeat_interval_s,
        )

    async def Heartbeat(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.HeartbeatRequest], context: Any
    ) -> AsyncIterator[pb.HeartbeatResponse]:
        member_id, incarnation = "", None
        try:
            async for beat in request_iterator:
                member_id = beat.member_id
                if incarnation is None and member_id in self.core.ledger.members:
                    incarnation = self.core.ledger.members[member_id].incarnations
                latest = await self.core.heartbeat(beat.member_id, beat.step, beat.model_version)
                yield pb.HeartbeatResponse(latest_version=latest)
        finally:  # the stream ended: the member exited or its connection broke
            if member_id:
                await asyncio.shield(self.core.mark_dead(member_id, "heartbeat stream closed", incarnation))
                log.warning("member_stream_closed", member=member_id)

    async def BeginExplorerStep(
        self, request: pb.BeginExplorerStepRequest, context: Any
    ) -> pb.BeginExplorerStepResponse:  # noqa: N802
        decision = await self.core.begin_explorer_step(request.member_id, request.step, request.model_version)
        if decision.load is None:
            return pb.BeginExplorerStepResponse(reason=decision.reason)
        return pb.BeginExplorerStepResponse(
            load_version=C.version_to_pb(decision.load),
            must_sync=True,
            files=C.files_to_pb(decision.load.files),
            reason=decision.reason,
        )

    async def BeginTrainerStep(
        self, request: pb.BeginTrainerStepRequest, context: Any
    ) -> pb.BeginTrainerStepResponse:  # noqa: N802
        return pb.BeginTrainerStepResponse(
            publish_after=await self.core.begin_trainer_step(request.member_id, request.step)
        )

    async def EndTrainerStep(
        self, request: pb.EndTrainerStepRequest, context: Any
    ) -> pb.EndTrainerStepResponse:  # noqa: N802
        publish, reason = await self.core.end_trainer_step(request.member_id, request.step)
        return pb.EndTrainerStepResponse(publish=publish, reason=reason)

    async def PublishVersion(
        self, request: pb.PublishVersionRequest, context: Any
    ) -> pb.PublishVersionResponse:  # noqa: N802
        version = await self.core.publish_version(
            request.member_id,
            request.version,
            request.checkpoint_path,
            tuple(C.files_from_pb(request.files)),
            tuple(C.tensors_from_pb(request.tensors)),
        )
        group = self.core.ledger.latest_group(version.version)
        receivers = group.members[1:] if group is not None and group.active else []
        log.info("version_published", version=version.version, receivers=receivers)
        return pb.PublishVersionResponse(
            version=C.version_to_pb(version), receivers=receivers, group_name=group.name if group else ""
        )

    async def ReportSync(self, request: pb.ReportSyncRequest, context: Any) -> pb.ReportSyncResponse:  # noqa: N802
        await self.core.report_sync(request.member_id, request.version, request.ok, request.error)
        if not request.ok:
            log.warning("sync_failed", member=request.member_id, version=request.version, error=request.error)
        return pb.ReportSyncResponse()

    async def JoinWeightGroup(
        self, request: pb.JoinWeightGroupRequest, context: Any
    ) -> pb.JoinWeightGroupResponse:  # noqa: N802
        got = await self.core.join_weight_group(
            request.member_id, request.version, request.master_address, request.master_port, request.backend
        )
        return pb.JoinWeightGroupResponse(
            master_address=got.group.master_address,
            master_port=got.group.master_port,
            world_size=len(got.group.members),
            rank=got.rank,
            group_name=got.group.name,
            backend=got.group.backend,
            tensors=C.tensors_to_pb(got.tensors),
            bucket_bytes=got.bucket_bytes,
        )

    async def WaitForVersion(
        self, request: pb.WaitForVersionRequest, context: Any
    ) -> pb.WaitForVersionResponse:  # noqa: N802
        remaining = context.time_remaining()
        version = await self.core.wait_for_version(request.min_version, remaining)
        return pb.WaitForVersionResponse(version=C.version_to_pb(version), files=C.files_to_pb(version.files))

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:  # noqa: N802
        latest, members, groups, now = self.core.status()
        return pb.GetStatusResponse(
            latest_version=C.version_to_pb(latest),
            members=[C.member_to_pb(m, now) for m in members],
            plan=C.plan_to_pb(self.core.plan),
            groups=[C.group_to_pb(g) for g in groups],
        )

    async def GetInfo(self, request: pb.GetInfoRequest, context: Any) -> pb.GetInfoResponse:  # noqa: N802
        latest, members, _, _ = self.core.status()
        stats = {
            "latest_version": float(latest.version),
            "members_alive": float(sum(m.alive for m in members)),
            "members_dead": float(sum(not m.alive for m in members)),
        }
        if self.server is None:
            raise errors.Unavailable("GetInfo needs the server handle")
        return pb.GetInfoResponse(info=self.server.info(__version__, stats))


def build_core(cfg: TrinityConfig) -> Synchronizer:
    """The core, with the ledger saved under the run dir and restored from there (see store.py)."""
    sync_cfg = cfg.synchronizer
    store = JsonFileStore(ledger_path(cfg.run_dir))
    core = Synchronizer(
        Plan.from_config(sync_cfg),
        member_timeout_s=sync_cfg.member_timeout_s,
        bucket_bytes=sync_cfg.bucket_mb << 20,
        store=store,
    )
    steps = {m.member_id: m.step for m in core.ledger.members.values()}
    log.info("ledger_loaded", path=store.path, latest_version=core.ledger.latest.version, members=steps)
    return core


async def serve(cfg: TrinityConfig) -> None:
    """Run the synchronizer until SIGTERM/SIGINT."""
    core = build_core(cfg)
    server = ServiceServer("synchronizer", cfg.services)
    servicer = SynchronizerServicer(core, cfg.synchronizer.heartbeat_interval_s, server)
    server.add(pb_grpc.add_SynchronizerServiceServicer_to_server, servicer, SERVICE_NAME)
    export_metrics(server.metrics, core)
    await server.start()
    period = min(cfg.synchronizer.heartbeat_interval_s, cfg.synchronizer.member_timeout_s / 4)
    sweeper = asyncio.create_task(core.run_sweeper(period))

    async def stop_sweeper() -> None:
        sweeper.cancel()

    server.on_shutdown(stop_sweeper)
    monitor = make_monitor(cfg, "synchronizer")

    async def counters() -> dict[str, float]:
        latest, members, _, _ = core.status()
        return {
            "sync/latest_version": float(latest.version),
            "sync/members_alive": float(sum(m.alive for m in members)),
            "sync/members_dead": float(sum(not m.alive for m in members)),
        }

    sampler = asyncio.create_task(every(monitor, cfg.monitor.interval_s, counters))

    async def stop_sampler() -> None:
        sampler.cancel()
        monitor.close()

    server.on_shutdown(stop_sampler)
    log.info("synchronizer_ready", plan=str(core.plan), port=server.port)
    await server.wait()
