"""Plain values the buffer core returns and the client hands back (no SQLAlchemy, no grpc),
so clients import this module without pulling in the storage stack."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from services.common.experience import Task


@dataclass
class BufferSpec:
    """A buffer definition: name, kind, and the StorageConfig keys that apply (`options`).
    `options["is_eval"]` marks an evaluation taskset (keeps the last partial batch)."""

    name: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "kind": self.kind, "options": self.options}, sort_keys=True)


@dataclass
class MixSpec:
    """Training tasksets read as one under `name` (services/buffer/kinds/mix.py): the member tasksets,
    in config order, and the epochs or steps of the mix."""

    name: str
    members: list[str]
    total_epochs: int = 1
    total_steps: int | None = None


@dataclass
class ItemIn:
    """One experience to store: its serialized protobuf and the version that generated it."""

    payload: bytes
    model_version: int


@dataclass
class WriteResult:
    written: int
    duplicate: bool = False
    evicted: int = 0


@dataclass
class ReadResult:
    lease_id: str
    payloads: list[bytes]
    end_of_data: bool
    lease_expires_at: float


@dataclass
class TaskBatch:
    tasks: list[Task]
    epoch: int
    batch_index: int
    end_of_data: bool


@dataclass
class Stats:
    name: str
    kind: str
    depth: int = 0
    leased: int = 0
    written: int = 0
    read: int = 0
    acked: int = 0
    dropped: int = 0
    per_model_version: dict[int, int] = field(default_factory=dict)
    oldest_item_age_s: float = 0.0
    end_of_data: bool = False
