"""Domain records of the synchronizer: members, published versions, weight-transfer groups.

Plain dataclasses, no grpc, no torch. `core.Synchronizer` owns one `Ledger` and mutates it under
its asyncio condition.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

TRAINER = "trainer"
EXPLORER = "explorer"


@dataclass(frozen=True)
class FileEntry:
    """One file of a published checkpoint (path relative to the checkpoint dir, size in bytes) and
    its checksum: hex SHA-256, or zlib's CRC-32 (sha256 empty) as sync checkpoints record it."""

    path: str
    size: int
    sha256: str = ""
    crc32: int | None = None


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a broadcast state dict, in broadcast order."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Version:
    """A published model version (version = trainer step; 0 = base model)."""

    version: int
    checkpoint_path: str = ""
    files: tuple[FileEntry, ...] = ()
    tensors: tuple[TensorEntry, ...] = ()
    published_at: float = 0.0


BASE_VERSION = Version(0)


@dataclass
class Member:
    """A trainer or explorer as the ledger sees it. Steps count completed steps."""

    member_id: str
    role: str
    step: int = 0
    held: int = 0
    """Version the member holds (it says so in every BeginExplorerStep and heartbeat)."""
    attempted: int = 0
    """Newest version it tried to load, successfully or not (a failed sync is not retried)."""
    last_sync_step: int = 0
    """Completed step count when it last synced (dynamic_by_explorer counts from here)."""
    requested: bool = False
    """Wants a newer version: the trainer publishes after its next step."""
    alive: bool = True
    last_seen: float = field(default_factory=time.monotonic)
    last_sync_error: str = ""
    incarnations: int = 1


FORMING, OPEN, DONE, FAILED = "forming", "open", "done", "failed"


@dataclass
class Group:
    """The torch.distributed group that carries one version (sync_method nccl).

    Formed at publish time from the trainer (rank 0) and the explorers that will load the
    version; opened when rank 0 says where its store listens; done when every rank reported
    success; failed at the first failure report or death of a member, never reused.
    """

    name: str
    version: int
    members: list[str]
    state: str = FORMING
    master_address: str = ""
    master_port: int = 0
    backend: str = "gloo"
    error: str = ""
    reported_ok: set[str] = field(default_factory=set)

    @property
    def active(self) -> bool:
        return self.state in (FORMING, OPEN)

    def rank_of(self, member_id: str) -> int:
        return self.members.index(member_id)

    def fail(self, error: str) -> None:
        if self.active:
            self.state, self.error = FAILED, error


@dataclass
class Ledger:
    """All state of the synchronizer. Its durable part (latest version, members' steps and held
    versions) is saved by services/synchronizer/store.py; liveness and groups live in memory only."""

    members: dict[str, Member] = field(default_factory=dict)
    latest: Version = BASE_VERSION
    groups: list[Group] = field(default_factory=list)
    generation: int = 0

    def explorers(self, *, alive_only: bool = True) -> list[Member]:
        return sorted(
            (m for m in self.members.values() if m.role == EXPLORER and (m.alive or not alive_only)),
            key=lambda m: m.member_id,
        )

    def trainer(self) -> Member | None:
        return next((m for m in self.members.values() if m.role == TRAINER), None)

    def trainer_done(self) -> int:
        trainer = self.trainer()
        return max(trainer.step if trainer else 0, self.latest.version)

    def any_request(self) -> bool:
        return any(m.requested for m in self.explorers())

    def group_for(self, member_id: str, above: int) -> Group | None:
        """Newest active group that includes `member_id` and carries a version > `above`."""
        for group in reversed(self.groups):
            if group.active and group.version > above and member_id in group.members:
                return group
        return None

    def latest_group(self, version: int) -> Group | None:
        return next((g for g in reversed(self.groups) if g.version == version), None)

    def new_group(self, version: int, trainer_id: str, explorer_ids: list[str]) -> Group:
        self.generation += 1
        group = Group(f"trinity-weights-v{version}-g{self.generation}", version, [trainer_id, *explorer_ids])
        self.groups.append(group)
        del self.groups[:-32]  # status shows recent history only
        return group

    def fail_groups_of(self, member_id: str, error: str) -> None:
        for group in self.groups:
            if group.active and member_id in group.members and member_id not in group.reported_ok:
                group.fail(error)
