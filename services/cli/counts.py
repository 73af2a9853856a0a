"""The counters of a finished stage for summary.json (written = trained + buffered + dropped)."""

from __future__ import annotations

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
    name = experience_buffer.name or "experience_buffer"
    async with await BufferClient.connect(cfg.services.buffer.address, services_cfg=cfg.services) as buffer:
        stats = await buffer.stats(name)
    # The run dir may hold an earlier run's trainer progress (train, then explore): count it only
    # when this run trains.
    got = st.progress_tally(cfg) if "trainer" in WORKERS_OF_MODE[cfg.mode] else Tally()
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
