"""What the trainer's run loop (service.py) talks to and reports: the experience source and weight
sink it is given (protocols, so unit tests pass plain objects), the rows of one step, the status
GetInfo shows, and small helpers for progress records.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.common.config.schema import TrinityConfig
from services.common.experience import Experience


class LeasedRead(Protocol):
    """What a buffer read returns (BufferClient's ReadResult has these attributes)."""

    lease_id: str
    experiences: list[Experience]
    end_of_data: bool


class ExperienceSource(Protocol):
    """The buffer as the trainer sees it (services.buffer.client.BufferClient fits)."""

    async def read(
        self,
        buffer: str,
        batch_size: int,
        *,
        max_wait: float,
        lease_s: float,
        reader_id: str = "",
        min_model_version: int = 0,
    ) -> LeasedRead: ...

    async def ack(self, lease_id: str) -> Any: ...

    async def nack(self, lease_id: str) -> Any: ...

    async def nack_reader(self, buffer: str, reader_id: str) -> int:
        """Give back every lease `reader_id` holds in `buffer`; returns the rows made readable."""
        ...


class WeightSink(Protocol):
    """Where new versions go (the synchronizer's publisher, or nothing in train-only runs)."""

    async def begin_step(self, step: int) -> None:
        """Called before step `step` reads data; may wait until the sync plan lets it run."""

    async def end_step(self, step: int, engine: Any) -> bool:
        """Called after step `step` was applied and acked; publishes engine.full_model_state() when due."""

    async def close(self) -> None: ...


class NullSink:
    """No synchronizer (mode train, SFT): versions are only the checkpoints."""

    async def begin_step(self, step: int) -> None:
        return None

    async def end_step(self, step: int, engine: Any) -> bool:
        return False

    async def close(self) -> None:
        return None


@dataclass
class Collected:
    """The rows of one step and the leases that hold them."""

    experiences: list[Experience] = field(default_factory=list)
    is_expert: list[bool] = field(default_factory=list)
    leases: list[str] = field(default_factory=list)
    per_buffer: dict[str, int] = field(default_factory=dict)
    end_of_data: bool = False


@dataclass
class Status:
    """What GetInfo reports."""

    state: str = "starting"
    step: int = 0
    model_version: int = 0
    loss: float = float("nan")
    tokens_per_s: float = 0.0
    # Over the whole run (every restart of this trainer): optimizer steps a crash discarded that
    # were not trained again (trainer.replay_lost_updates off), their rows, and steps replayed.
    updates_lost: int = 0
    rows_update_lost: int = 0
    steps_replayed: int = 0
    last_checkpoint: str = ""


def max_model_length(cfg: TrinityConfig, model: Any) -> int | None:
    """Longest row the trainer accepts: model.max_model_len if set, else the model's position limit."""
    if cfg.model.max_model_len is not None:
        return cfg.model.max_model_len
    config = getattr(model, "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(limit) if limit else None


def experience_key(exp: Experience) -> str:
    """A short id of an experience for progress records: batch_id/task_id/run_id, after `producer:`
    when an explorer wrote it (explorers reading one taskset make the same batch/task/run ids)."""
    key = f"{exp.batch_id}/{exp.task_id}/{exp.run_id}"
    return f"{exp.producer}:{key}" if exp.producer else key


def rows_of(progress_lines: Sequence[str]) -> list[str]:
    """Every experience key recorded in progress.jsonl lines (tests and audits)."""
    keys: list[str] = []
    for line in progress_lines:
        if line.strip():
            keys.extend(json.loads(line)["rows"])
    return keys
