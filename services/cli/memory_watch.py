"""The memory a stage needs from the machine: the resident memory of all its services at once.

Each service reports its own peak (`peak_rss_mb` in summary.json's phases). Those peaks need not
come at the same moment, so their sum overstates what the machine needed, and a service's own
count leaves out the processes it starts (a vLLM engine core). `trinity run` therefore samples,
every INTERVAL_S seconds, the resident set of every service it started and of their descendants,
adds them up, and keeps the highest total with its split by service: summary.json's `memory`
{"peak_total_rss_mb", "at_peak": {service: MiB}, "interval_s", "samples"}.

Caveats, both said where the figure is printed: RSS counts a page two processes share in both
(mode colocate's weights), so the total overstates by that; and a spike shorter than the interval
can fall between two samples (the per-service peaks bound it from above).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

INTERVAL_S = 0.5
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc; [pid] alone where children are not listed)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{current}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
    return out


def rss_mb(pid: int) -> float:
    """Resident memory of one process in MiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_MB
    except (OSError, IndexError, ValueError):
        return 0.0


class MemoryWatch:
    """Samples the services `pids()` names ({label: pid}, read at every sample: restarts and services
    started later count) and keeps the highest total; see the module docstring."""

    def __init__(self, pids: Callable[[], dict[str, int]], interval: float = INTERVAL_S) -> None:
        self.pids = pids
        self.interval = interval
        self.samples = 0
        self.peak = 0.0
        self.at_peak: dict[str, float] = {}

    def sample(self) -> float:
        """One sample: the total now (MiB), kept when it is the highest so far."""
        split = {label: sum(rss_mb(p) for p in descendants(pid)) for label, pid in self.pids().items()}
        total = sum(split.values())
        self.samples += 1
        if total > self.peak:
            self.peak, self.at_peak = total, split
        return total

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(self.interval)

    def result(self, before: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """summary.json's `memory`: this watch's peak, or `before` (a continued stage's earlier
        runs) where that was higher; None when nothing was sampled."""
        if self.samples == 0 or self.peak <= 0:
            return before
        if before and before.get("peak_total_rss_mb", 0.0) >= self.peak:
            return {**before, "samples": before.get("samples", 0) + self.samples}
        return {
            "peak_total_rss_mb": round(self.peak, 1),
            "at_peak": {label: round(mb, 1) for label, mb in sorted(self.at_peak.items())},
            "interval_s": self.interval,
            "samples": self.samples + (before or {}).get("samples", 0),
        }


async def run_watched(runner: Any, entry: dict[str, Any], save: Callable[[], None]) -> int:
    """`runner.run(entry, save)` (a StageRunner) with its children sampled meanwhile; the result goes
    into entry["memory"] and is saved, however the run ends."""
    watch = MemoryWatch(lambda: {label: child.proc.pid for label, child in runner.children.items()})
    sampling = asyncio.create_task(watch.run())
    try:
        code: int = await runner.run(entry, save)
    finally:
        sampling.cancel()
        if (memory := watch.result(entry.get("memory"))) is not None:
            entry["memory"] = memory
            save()
    return code


def format_memory(stage_name: str, memory: dict[str, Any] | None) -> list[str]:
    """`grpo: all services at once, peak 7.2 GiB (trainer 4.0, explorer 3.0, ...)`."""
    if not memory:
        return []
    split = ", ".join(f"{label} {mb / 1024:.1f}" for label, mb in memory["at_peak"].items())
    return [
        f"{stage_name}: all services at once, peak {memory['peak_total_rss_mb'] / 1024:.1f} GiB "
        f"({split}; resident sets sampled every {memory['interval_s']} s, shared pages counted in each)"
    ]
