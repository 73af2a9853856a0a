"""The trainer process: the gRPC TrainerService (GetInfo, SaveCheckpoint) plus the training loop.

`serve(cfg)` starts the server first (health SERVING while the model loads, so `trinity run`
sees the process alive), builds the engine (resuming the latest checkpoint), connects to the buffer
(and to the synchronizer when an explorer consumes the weights), then runs the loop. It returns —
exit code 0 — when total_steps are done or the data ended; SIGTERM finishes the step in progress,
saves a checkpoint and returns as well.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from services.common.config.schema import TrinityConfig
from services.common.errors import FailedPrecondition
from services.common.logging import get_logger
from services.common.server import ServiceServer
from services.common.version import __version__
from trinity_grpc.trainer.v1 import trainer_pb2 as tpb
from trinity_grpc.trainer.v1 import trainer_pb2_grpc

log = get_logger("trainer")
SERVICE_NAME = "trinity_grpc.trainer.v1.TrainerService"


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    """Thin: reads the loop's status, asks it to save."""

    def __init__(self, server: ServiceServer) -> None:
        self.server = server
        self.loop: Any = None  # TrainerLoop once the model is loaded
        self.state = "loading"

    async def GetInfo(self, request: tpb.GetInfoRequest, context: Any) -> tpb.GetInfoResponse:  # noqa: N802
        if self.loop is None:
            return tpb.GetInfoResponse(info=self.server.info(__version__, state=self.state))
        s = self.loop.status
        stats = {
            "step": float(s.step),
            "loss": s.loss,
            "model_version": float(s.model_version),
            "tokens_per_s": s.tokens_per_s,
            "samples": float(self.loop.cursor.samples),
            "updates_lost": float(s.updates_lost),
            "rows_update_lost": float(s.rows_update_lost),
            "steps_replayed": float(s.steps_replayed),
        }
        return tpb.GetInfoResponse(info=self.server.info(__version__, stats=stats, state=s.state))

    async def SaveCheckpoint(
        self, request: tpb.SaveCheckpointRequest, context: Any
    ) -> tpb.SaveCheckpointResponse:  # noqa: N802
        if self.loop is None:
            raise FailedPrecondition(
                "the trainer is still loading its model; retry when GetInfo reports a step"
            )
        path, step = await self.loop.save()
        return tpb.SaveCheckpointResponse(path=path, step=step)


def publishes(cfg: TrinityConfig) -> bool:
    """Does this trainer publish versions? In mode both; in mode train when its plan is one a
    serve-mode proxy follows (sync_method checkpoint, sync_style dynamic_by_trainer or fully_async):
    the proxy loads what a train run beside it publishes (Trinity's serve + train pair)."""
    sync = cfg.synchronizer
    serve_styles = ("dynamic_by_trainer", "fully_async")
    serve_plan = sync.method == "checkpoint" and sync.normalized_style in serve_styles
    return cfg.mode in ("both", "colocate") or (cfg.mode == "train" and serve_plan)


async def make_sink(cfg: TrinityConfig) -> Any:
    """The synchronizer's weight publisher when an explorer consumes versions, else a NullSink."""
    from services.trainer.ports import NullSink

    if not publishes(cfg):
        return NullSink()
    from services.trainer.publish import connect_sink

    return await connect_sink(cfg)


def run_follower(cfg: TrinityConfig, ctx: Any) -> None:
    """Ranks > 0 under torchrun: hold a shard, run rank 0's collective calls, exit when it says stop."""
    import signal

    from services.trainer.build import build_engine
    from services.trainer.distributed import exit_rank, follow

    # torchrun forwards SIGTERM to every rank; rank 0 then still needs us for the final checkpoint.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    built = build_engine(cfg, dist=ctx)
    log.info("follower_ready", rank=ctx.rank, world_size=ctx.world_size)
    follow(built.engine, ctx)
    exit_rank(0)


async def stop_within(loop: Any, run: asyncio.Future[None], deadline: float) -> None:
    """Let the step in progress finish while it can end by `deadline` (time.monotonic()) with time
    left for the final checkpoint (as long as the last one took); otherwise abandon it: the
    engine stops before its optimizer step and the step's rows go back to the buffer."""
    left = deadline - time.monotonic() - loop.last_save_s
    if left > 0:
        await asyncio.wait({run}, timeout=left)
    if not run.done():
        log.warning(
            "trainer_step_abandoned_at_stop", step=loop.engine.step + 1, waited_s=round(max(left, 0), 2)
        )
        loop.abandon_step()


async def serve(cfg: TrinityConfig) -> None:
    from services.buffer.client import BufferClient
    from services.common.monitor import make_monitor
    from services.trainer.build import build_engine
    from services.trainer.dataset_source import DatasetAwareSource
    from services.trainer.distributed import LeaderEngine, exit_rank, init_distributed
    from services.trainer.metrics import step_mirror
    from services.trainer.service import TrainerLoop

    ctx = init_distributed() if cfg.trainer.strategy == "fsdp2" else None
    if ctx is not None and not ctx.is_main:
        run_follower(cfg, ctx)
        return
    server = ServiceServer("trainer", cfg.services)
    servicer = TrainerServicer(server)
    server.add(trainer_pb2_grpc.add_TrainerServiceServicer_to_server, servicer, SERVICE_NAME)
    port = await server.start()
    log.info("trainer_listening", port=port)
    serving = asyncio.ensure_future(server.wait())  # returns after SIGTERM/SIGINT or request_stop()
    engine: Any = None
    try:
        built = await asyncio.to_thread(build_engine, cfg, dist=ctx)
        engine = LeaderEngine(built.engine, ctx) if ctx is not None else built.engine
        if cfg.mode == "colocate":  # the explorer's engine maps these parameters (colocate.py)
            from services.trainer.colocate import share_policy

            engine = await asyncio.to_thread(share_policy, built.engine, cfg.run_dir)
        async with await BufferClient.connect(
            cfg.services.buffer.address, services_cfg=cfg.services
        ) as buffer:
            sink = await make_sink(cfg)
            loop = TrainerLoop(
                cfg,
                engine,
                built.tokenizer,
                DatasetAwareSource(buffer, built.tokenizer, cfg),
                sink=sink,
                monitor=step_mirror(make_monitor(cfg, "trainer"), server.metrics),
                state=built.state,
            )
            servicer.loop = loop
            run = asyncio.ensure_future(loop.run())
            await asyncio.wait({run, serving}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                log.info("trainer_stopping", step=loop.engine.step)
                loop.request_stop()
                await stop_within(loop, run, server.stop_deadline)
            await run
    finally:
        if ctx is not None and engine is not None:
            engine.shutdown()
        server.request_stop()
        await serving
    if ctx is not None:  # the run ended without an error and the followers are released
        exit_rank(0)
