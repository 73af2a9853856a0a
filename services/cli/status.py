"""`trinity status`: health, version and state of each service named in a config."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.client import ServiceClient
from services.common.config import TrinityConfig, load_config
from services.common.config.services import SERVICE_NAMES, ServicesConfig
from services.common.entry import SERVICE_PROTOS
from services.common.errors import TrinityError
from services.common.health import check_health
from trinity_grpc.common.v1 import common_pb2


async def service_info(
    name: str, address: str, services_cfg: ServicesConfig | None, timeout: float
) -> common_pb2.ServiceInfo:
    package, module, service_cls = SERVICE_PROTOS[name]
    pb2 = importlib.import_module(f"{package}.{module}_pb2")
    pb2_grpc = importlib.import_module(f"{package}.{module}_pb2_grpc")
    client_cls: type[ServiceClient] = type(
        f"{service_cls}InfoClient", (ServiceClient,), {"stub_class": getattr(pb2_grpc, f"{service_cls}Stub")}
    )
    client = await client_cls.connect(address, services_cfg=services_cfg, timeout=timeout, max_retries=0)
    try:
        return (await client._call("GetInfo", pb2.GetInfoRequest())).info
    finally:
        await client.close()


@dataclass
class ServiceRow:
    """What `trinity status` shows of one service."""

    name: str
    address: str
    health: str
    version: str = ""
    state: str = ""
    stats: dict[str, float] = field(default_factory=dict)


async def service_rows(cfg: TrinityConfig, *, timeout: float = 3.0) -> list[ServiceRow]:
    """Health, then version, state and stats of each service the config names (`trinity view` too)."""
    rows = []
    for name in SERVICE_NAMES:
        address = cfg.services.endpoint(name).address
        row = ServiceRow(
            name, address, await check_health(address, timeout=timeout, services_cfg=cfg.services)
        )
        if row.health == "SERVING":
            try:
                info = await service_info(name, address, cfg.services, timeout)
                row.version, row.state, row.stats = info.version, info.state, dict(info.stats)
            except TrinityError as exc:
                row.state = f"GetInfo failed: {exc}"
        rows.append(row)
    return rows


async def status(config: str | None, overrides: Sequence[str] = (), *, timeout: float = 3.0) -> int:
    cfg = load_config(config, overrides)
    print(f"{'service':<13} {'address':<22} {'health':<12} {'version':<9} {'state':<18} stats")
    rows = await service_rows(cfg, timeout=timeout)
    for r in rows:
        stats = " ".join(f"{k}={v:g}" for k, v in sorted(r.stats.items()))
        print(f"{r.name:<13} {r.address:<22} {r.health:<12} {r.version:<9} {r.state:<18} {stats}")
    return 0 if all(r.health == "SERVING" for r in rows) else 1
