"""The explorer process: the gRPC ExplorerService (GetInfo, Evaluate) plus the step loop.

`serve(cfg)` starts the server first (health SERVING while the model loads), builds the engines
and runners, connects to the buffer (and to the synchronizer in mode `both`), then runs:
- mode both / explore: steps until the taskset ends, closes its writer on the experience buffer
  (so the trainer sees end of data) and returns — exit code 0;
- mode bench: evaluates each checkpoint under the run directory in order (only the latest with
  explorer.bench_on_latest_checkpoint), or the configured model when there is none, and returns;
- mode serve: runs the OpenAI-compatible proxy (services/explorer/serve/) until SIGTERM.
SIGTERM stops the loop between awaits and returns without closing the writer (a restarted
explorer resumes at the next unread batch, whose cursor the buffer keeps).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from services.common.config.schema import TrinityConfig
from services.common.errors import FailedPrecondition
from services.common.logging import get_logger
from services.common.server import ServiceServer
from services.common.version import __version__
from trinity_grpc.explorer.v1 import explorer_pb2 as epb
from trinity_grpc.explorer.v1 import explorer_pb2_grpc

if TYPE_CHECKING:  # the explorer module imports torch: kept out of `--help`
    from services.explorer.weight_sync import WeightSync

log = get_logger("explorer.server")
SERVICE_NAME = "trinity_grpc.explorer.v1.ExplorerService"


class ExplorerServicer(explorer_pb2_grpc.ExplorerServiceServicer):
    """Thin: reads the explorer's status, runs an evaluation on demand."""

    def __init__(self, server: ServiceServer) -> None:
        self.server = server
        self.explorer: Any = None
        self.state = "loading"

    async def GetInfo(self, request: epb.GetInfoRequest, context: Any) -> epb.GetInfoResponse:  # noqa: N802
        ex = self.explorer
        if ex is None:
            return epb.GetInfoResponse(info=self.server.info(__version__, state=self.state))
        m = ex.last_metrics
        stats = {
            "step": float(ex.step),
            "model_version": float(ex.model_version),
            "experiences_written": float(ex.written),
            "reward_mean": m.get("rollout/reward/mean", 0.0),
            "tokens_per_s": m.get("rollout/tokens_per_s", 0.0),
            **ex.last_eval,
        }
        if ex.last_eval:
            stats["eval_step"] = float(ex.last_eval_step)
        return epb.GetInfoResponse(info=self.server.info(__version__, stats=stats, state=ex.state))

    async def Evaluate(self, request: epb.EvaluateRequest, context: Any) -> epb.EvaluateResponse:  # noqa: N802
        ex = self.explorer
        if ex is None:
            raise FailedPrecondition(
                "the explorer is still loading its model; retry when GetInfo reports a state"
            )
        if not ex.evaluator.tasksets:
            raise FailedPrecondition(
                "no eval tasksets configured (buffer.explorer_input.eval_tasksets)", field="tasksets"
            )
        unknown = sorted(set(request.tasksets) - set(ex.evaluator.names))
        if unknown:
            from services.common.errors import NotFound

            raise NotFound(
                f"unknown eval tasksets {unknown}; configured: {ex.evaluator.names}", field="tasksets"
            )
        scores = await ex.evaluate(ex.step, list(request.tasksets) or None)
        return epb.EvaluateResponse(scores=scores, model_version=ex.model_version)


class NullWeightSync:
    """mode explore (no trainer): the weights never change."""

    def __init__(self, weights: Any) -> None:
        self.weights = weights
        self.lock: asyncio.Lock = weights.lock  # bench mode's checkpoint loads take it, as evals do

    async def before_step(self, step: int) -> int | None:
        return None

    async def load_path(self, version: int, path: str) -> None:
        await self.weights.load_path(version, path)

    async def leave(self) -> None:
        """No weight groups to leave."""

    def during_step(self, step: int, on_loaded: Callable[[int], None]) -> Any:
        """No synchronizer: nothing loads mid-step."""
        return self.weights.during_step(step, on_loaded)


def build_parts(
    cfg: TrinityConfig, make_pool: Callable[[TrinityConfig, Any], Any] | None = None
) -> dict[str, Any]:
    """Everything that loads models (run in a thread so the server keeps answering).

    `make_pool(cfg, tokenizer)`: the engines (default build_pool: the configured rollout engines);
    `trinity debug --endpoint` passes one that samples from a running server."""
    from services.explorer.build import build_auxiliary, build_pool, build_runner
    from services.explorer.plugins import load_plugins
    from services.explorer.runner import VersionRef
    from services.models.loading import load_tokenizer

    os.environ.update(cfg.explorer.env_vars)
    load_plugins(cfg.explorer.plugin_dirs)
    if cfg.model.external_model.enable:  # mode bench on a remote chat API: no model loads here
        from services.explorer.build import build_external_runner

        return {"runner": build_external_runner(cfg), "pool": None, "owned": []}
    tokenizer = load_tokenizer(cfg.model.model_path, cfg.model.tokenizer_path)
    pool = (make_pool or build_pool)(cfg, tokenizer)
    aux_wrappers, owned = build_auxiliary(cfg)
    runner = build_runner(cfg, pool, tokenizer, VersionRef(), aux_wrappers)
    return {"tokenizer": tokenizer, "pool": pool, "runner": runner, "owned": owned}


async def connect_weight_sync(cfg: TrinityConfig, pool: Any) -> tuple[WeightSync, Any]:
    """(weight sync, synchronizer client or None): the synchronizer only in modes both and colocate."""
    from services.explorer.weight_sync import EngineWeights, ServiceWeightSync

    if cfg.mode not in ("both", "colocate"):
        return NullWeightSync(EngineWeights(pool)), None
    from services.synchronizer.client import SynchronizerClient
    from services.synchronizer.weights import WeightReceiver

    client = await SynchronizerClient.connect(cfg.services.synchronizer.address, services_cfg=cfg.services)
    registration = await client.register(cfg.explorer.name, "explorer")
    client.start_heartbeat()
    receiver = WeightReceiver(client, cfg)
    if cfg.mode == "colocate":  # the engine maps the trainer's parameters (colocate.py)
        from services.explorer.colocate import SharedWeightSync

        return SharedWeightSync(pool, client, receiver, registration.plan), client
    return ServiceWeightSync(pool, client, receiver, registration.plan), client


async def run_mode(cfg: TrinityConfig, explorer: Any) -> None:
    if cfg.mode == "bench":
        from services.explorer.engines.weights import list_step_dirs

        found = list_step_dirs(os.path.join(cfg.run_dir, "checkpoints", "full"), cfg.run_dir)
        if cfg.model.external_model.enable:  # the remote model's weights are its server's: score it once
            found = []
        if cfg.explorer.bench_on_latest_checkpoint:
            found = found[-1:]
        await explorer.bench(found)
    else:
        await explorer.run()


async def serve(cfg: TrinityConfig) -> None:
    from services.buffer.client import BufferClient
    from services.common.monitor import make_monitor
    from services.explorer.explorer import Explorer
    from services.explorer.metrics import step_mirror

    if cfg.mode == "train":
        raise FailedPrecondition(
            "mode train runs no explorer; start the explorer with mode both, explore or bench", field="mode"
        )
    server = ServiceServer("explorer", cfg.services)
    servicer = ExplorerServicer(server)
    server.add(explorer_pb2_grpc.add_ExplorerServiceServicer_to_server, servicer, SERVICE_NAME)
    port = await server.start()
    log.info("explorer_listening", port=port)
    serving = asyncio.ensure_future(server.wait())
    if cfg.mode == "serve":  # the explorer is the OpenAI-compatible proxy (services/explorer/serve/)
        from services.explorer.serve.process import serve_proxy

        servicer.state = "serving"
        try:
            await serve_proxy(cfg, serving, servicer)
        finally:
            server.request_stop()
            await serving
        return
    parts: dict[str, Any] = {}
    sync_client = None
    monitor = None
    try:
        parts = await asyncio.to_thread(build_parts, cfg)
        monitor = step_mirror(make_monitor(cfg, "explorer"), server.metrics)
        async with await BufferClient.connect(
            cfg.services.buffer.address, services_cfg=cfg.services
        ) as buffer:
            weights, sync_client = await connect_weight_sync(cfg, parts["pool"])
            explorer = Explorer(cfg, buffer=buffer, weights=weights, runner=parts["runner"], monitor=monitor)
            servicer.explorer = explorer
            run = asyncio.ensure_future(run_mode(cfg, explorer))
            await asyncio.wait({run, serving}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                log.info("explorer_stopping", step=explorer.step)
                run.cancel()
            try:
                await run
            except asyncio.CancelledError:
                pass
    finally:
        if sync_client is not None:
            await sync_client.close()
        if monitor is not None:
            monitor.close()
        for key in ("runner", "pool"):
            if parts.get(key) is not None:
                parts[key].close()
        for obj in parts.get("owned", []):
            obj.close()
        server.request_stop()
        await serving
