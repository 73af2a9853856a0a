"""A tiny gRPC health-protocol probe (used by `trinity health`, `trinity run` and container healthchecks)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config.services import ServicesConfig
from services.common.security import channel_credentials


async def check_health(
    address: str, service: str = "", *, timeout: float = 3.0, services_cfg: ServicesConfig | None = None
) -> str:
    """Return the serving status name ("SERVING", "NOT_SERVING", ...) or "UNREACHABLE"."""
    cfg = services_cfg or ServicesConfig()
    creds = channel_credentials(cfg.tls)
    options = (
        [("grpc.ssl_target_name_override", cfg.tls.server_name_override)]
        if cfg.tls.server_name_override
        else []
    )
    channel = (
        grpc.aio.insecure_channel(address, options=options)
        if creds is None
        else grpc.aio.secure_channel(address, creds, options=options)
    )
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return "SERVICE_UNKNOWN"
        return "UNREACHABLE"
    finally:
        await channel.close()


async def wait_healthy(
    address: str,
    timeout: float = 60.0,
    *,
    service: str = "",
    services_cfg: ServicesConfig | None = None,
    alive: Callable[[], bool] | None = None,  # False when the process died (stop waiting early)
    finished: Callable[[], bool] | None = None,  # True when it exited cleanly (done, not failed)
) -> None:
    """Poll until `address` reports SERVING; TimeoutError after `timeout` seconds. A process that
    is no longer `alive` ends the wait: RuntimeError, unless it `finished` (exit code 0: a bench
    explorer against a fast remote API can do all its work within one poll on a loaded machine,
    and what it did is judged by its exit code, as for any finished child)."""
    deadline = time.monotonic() + timeout
    while True:
        if alive is not None and not alive():
            if finished is not None and finished():
                return
            raise RuntimeError(f"process serving {address} exited before it became healthy")
        status = await check_health(address, service, timeout=1.0, services_cfg=services_cfg)
        if status == "SERVING":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{address} not SERVING after {timeout:.0f}s (last status {status})")
        await asyncio.sleep(0.1)
