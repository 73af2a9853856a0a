"""Metrics sinks: TensorBoard scalars under <run dir>/monitor/tensorboard/<service>, or nothing.

Event files are written with the `tensorboard` package alone (no torch import, ~0.2 s), so the
buffer and the synchronizer log too: `every()` samples a service's counters periodically.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from services.common.config.schema import TrinityConfig

_peak_before_resets_kib = 0  # reset_peak_rss lowers the kernel's count; the peak so far is kept here


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (`memory/peak_rss_mb`; summary.json's
    per-service `peak_rss_mb`), also across reset_peak_rss."""
    import resource

    now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux reports KiB
    return max(now, _peak_before_resets_kib) / 1024.0


def reset_peak_rss() -> None:
    """Restart the kernel's peak-resident-memory count (VmHWM, and ru_maxrss with it) from the current
    resident memory, so that a peak over a span can be read (the trainer's per-phase peaks);
    peak_rss_mb still gives the peak since start. Linux only: OSError elsewhere."""
    import resource

    global _peak_before_resets_kib
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # 5: reset the peak resident set size
    _peak_before_resets_kib = max(_peak_before_resets_kib, before)


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
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        os.makedirs(log_dir, exist_ok=True)
        self.log_dir = log_dir
        self._writer = EventFileWriter(log_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=key, simple_value=float(value)) for key, value in metrics.items()]
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=Summary(value=values)))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


async def every(
    monitor: Monitor, interval_s: float, collect: Callable[[], Awaitable[dict[str, float]]]
) -> None:
    """Log `collect()` every `interval_s` seconds, the step being the seconds since the start; runs until
    cancelled (a failed collection is skipped)."""
    start = time.monotonic()
    while True:
        await asyncio.sleep(interval_s)
        try:
            metrics = await collect()
        except Exception:  # noqa: BLE001 - metrics must never take a service down
            continue
        if metrics:
            monitor.log(metrics, int(time.monotonic() - start))


def tensorboard_dir(cfg: TrinityConfig, service: str = "") -> str:
    base = os.path.join(cfg.run_dir, "monitor", "tensorboard")
    return os.path.join(base, service) if service else base


def make_monitor(cfg: TrinityConfig, service: str) -> Monitor:
    if cfg.monitor.monitor_type == "none":
        return NullMonitor()
    if cfg.monitor.monitor_type != "tensorboard":  # wandb, mlflow, swanlab: optional packages
        from services.common.monitor_extras import SINKS

        log_dir = os.path.join(cfg.run_dir, "monitor", cfg.monitor.monitor_type)
        sink: Monitor = SINKS[cfg.monitor.monitor_type](
            cfg.project,
            "/".join(p for p in (cfg.group, cfg.name, service) if p),
            log_dir,
            dict(cfg.monitor.monitor_args),
        )
        return sink
    return TensorBoardMonitor(tensorboard_dir(cfg, service))
