"""The counters of a finished stage for summary.json (written = trained + buffered + dropped)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

from services.cli import stages as st
from services.cli.phases import stage_phases
from services.cli.prepare import WORKERS_OF_MODE
from services.common.config import TrinityConfig
from services.trainer.tally import Tally


async def record_counts(cfg: TrinityConfig, entry: dict[str, Any]) -> None:
    """The stage's counters into its summary entry: steps and tokens trained, experiences written /
    trained / buffered / dropped (by reason), and the phase breakdown of each worker."""
    from services.buffer.client import BufferClient

    experience_buffer = cfg.buffer.trainer_input.experience_buffer
    name = experience_buffer.name
    async with await BufferClient.connect(cfg.services.buffer.address, services_cfg=cfg.services) as buffer:
        stats = await buffer.stats(name)
    # The run dir may hold an earlier run's trainer progress (train, then explore): count it only
    # when this run trains (serve: its `mode: train` trainer runs beside it, in the same run dir).
    trains = "trainer" in WORKERS_OF_MODE[cfg.mode] or cfg.mode == "serve"
    got = st.progress_tally(cfg) if trains else Tally()
    entry["steps"], entry["tokens_trained"] = got.steps, got.tokens
    entry["updates_lost"] = got.updates_lost
    # Rows the explorers' pipelines dropped before writing count as written (produced) and dropped.
    before_write = st.explorer_drops(cfg) if "explorer" in WORKERS_OF_MODE[cfg.mode] else {}
    counts: dict[str, Any] = {
        "written": stats.written + sum(before_write.values()),
        "trained": got.trained,
    }
    if experience_buffer.storage_type == "file":
        # A dataset: rows are read, not written; nothing waits in a queue.
        counts = {"written": 0, "trained": got.trained, "dataset_rows_read": stats.written}
    # Rows of crash-lost steps that wait to be trained again sit in the trainer's replay journal.
    counts["buffered"] = (
        0 if experience_buffer.storage_type == "file" else stats.depth + stats.leased
    ) + got.awaiting_replay
    counts["dropped"] = {**before_write, **got.dropped}
    entry["experiences"] = counts
    entry["phases"] = stage_phases(cfg, WORKERS_OF_MODE[cfg.mode])


async def record_serve_counts(
    cfg: TrinityConfig, entry: dict[str, Any], stop: Callable[[str], Awaitable[None]]
) -> None:
    """Mode serve ends by Ctrl-C: stop the proxy (`stop("explorer")`), then record the counters while
    the buffer still runs, and the proxy's own (sessions, experiences committed and written, ...)
    from its history under `serve`. A failure is said, not raised: the run is stopping anyway."""
    from services.cli.prepare import say

    await stop("explorer")
    try:
        await record_counts(cfg, entry)
        entry["serve"] = proxy_counters(cfg)
    except Exception as exc:  # noqa: BLE001 - said; the services stop next whatever happened
        say(f"the stage's counters were not recorded: {type(exc).__name__}: {exc}", err=True)


def proxy_counters(cfg: TrinityConfig) -> dict[str, int]:
    """The counters in the proxy's history (explorer.db_url); none before it has one."""
    from services.explorer.serve.history import History, counters, default_db_url

    url = cfg.explorer.db_url or default_db_url(cfg.run_dir)
    if url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///") :]):
        return {}
    history = History(url)
    try:
        return history.call(counters)
    finally:
        history.close()
