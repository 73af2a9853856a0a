"""Metrics sinks: TensorBoard scalars for the processes that already hold torch, or nothing.

The buffer and synchronizer never call this with TensorBoard (it imports torch, ~1.3 s).
"""

from __future__ import annotations

import os
from typing import Protocol

from services.common.config.schema import TrinityConfig


class Monitor(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class NullMonitor:
    """Accepts metrics and drops them (monitor_type: none)."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        return None

    def close(self) -> None:
        return None


class TensorBoardMonitor:
    """Scalars under <run_dir>/monitor/tensorboard/<service>."""

    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(log_dir, exist_ok=True)
        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=log_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, float(value), step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def tensorboard_dir(cfg: TrinityConfig, service: str = "") -> str:
    base = os.path.join(cfg.run_dir, "monitor", "tensorboard")
    return os.path.join(base, service) if service else base


def make_monitor(cfg: TrinityConfig, service: str) -> Monitor:
    if cfg.monitor.monitor_type == "none":
        return NullMonitor()
    return TensorBoardMonitor(tensorboard_dir(cfg, service))
