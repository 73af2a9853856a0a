"""Where the synchronizer's ledger survives a crash: one JSON file, `<run dir>/synchronizer/ledger.json`.

Durable (`Snapshot`): the latest published Version (checkpoint path, file manifest, tensor list)
and, per member, its id, role, last completed step, the version it holds and the step of its last
sync. Not durable: liveness (a restored member gets a fresh `member_timeout_s` to beat again),
weight groups (a group in flight when the synchronizer died is gone: its members' calls fail and
the next sync builds a new one), a member's failed-sync bookkeeping and pending requests.

Writes replace the file atomically (temp file, then os.replace), so a reader sees the old ledger
or the new one, never half of one. A publish is written with fsync before it is acknowledged; step
changes are written without fsync (a killed process loses nothing: the page cache outlives it) and
only when a durable field changed, so heartbeats never write.

A missing file is a fresh run (version 0). An unreadable one stops the synchronizer with
FailedPrecondition naming the file: starting from version 0 would silently forget versions that
were acknowledged, which is the one thing this file is for.

The synchronizer never opens SQLite (the buffer is the only process that does), hence JSON.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

from services.common import errors
from services.synchronizer.ledger import FileEntry, Ledger, Member, TensorEntry, Version

FORMAT = 1


@dataclass(frozen=True)
class MemberRecord:
    """The durable part of a Member."""

    member_id: str
    role: str
    step: int
    held: int
    last_sync_step: int


@dataclass(frozen=True)
class Snapshot:
    """The durable part of a Ledger."""

    latest: Version
    members: tuple[MemberRecord, ...]

    @classmethod
    def of(cls, ledger: Ledger, latest: Version | None = None) -> Snapshot:
        """Snapshot of `ledger`, with `latest` instead of its own when given (a publish in progress)."""
        members = tuple(
            MemberRecord(m.member_id, m.role, m.step, m.held, m.last_sync_step)
            for m in sorted(ledger.members.values(), key=lambda m: m.member_id)
        )
        return cls(latest if latest is not None else ledger.latest, members)

    def restore(self, now: float) -> Ledger:
        """A ledger with these versions and members; members count as alive since `now`."""
        members = {
            r.member_id: Member(
                r.member_id,
                r.role,
                step=r.step,
                held=r.held,
                attempted=r.held,
                last_sync_step=r.last_sync_step,
                last_seen=now,
            )
            for r in self.members
        }
        return Ledger(members=members, latest=self.latest)


class LedgerStore(Protocol):
    def load(self) -> Snapshot | None:
        """The saved snapshot, or None when nothing was saved yet."""

    def save(self, snapshot: Snapshot, *, fsync: bool) -> None:
        """Replace the saved snapshot; with `fsync`, durable across a power loss when it returns."""


class NullStore:
    """Keeps nothing (unit tests, or a synchronizer without a run dir)."""

    def load(self) -> Snapshot | None:
        return None

    def save(self, snapshot: Snapshot, *, fsync: bool) -> None:
        pass


def ledger_path(run_dir: str) -> str:
    return os.path.join(run_dir, "synchronizer", "ledger.json")


class JsonFileStore:
    """The snapshot as one JSON file (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._saved: Snapshot | None = None
        self._saved_synced = False
        self._latest_json: tuple[Version, dict[str, Any]] | None = None

    def load(self) -> Snapshot | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                raw = json.load(fh)
            snapshot = _decode(raw)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise errors.FailedPrecondition(
                f"the synchronizer's ledger {self.path} is unreadable ({type(exc).__name__}: {exc}); "
                "restore it, or move it aside to start from version 0 (members re-register on their own, "
                "the trainer publishes again at its next sync)",
                field="synchronizer.ledger",
            ) from exc
        self._saved, self._saved_synced = snapshot, True
        return snapshot

    def save(self, snapshot: Snapshot, *, fsync: bool) -> None:
        if snapshot == self._saved and (self._saved_synced or not fsync):
            return
        data = json.dumps(self._encode(snapshot), separators=(",", ":")).encode()
        directory = os.path.dirname(self.path)
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(directory, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(data)
                if fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            if fsync:  # the rename itself is durable once the directory is
                dir_fd = os.open(directory, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        except OSError as exc:
            raise errors.Unavailable(
                f"could not write the synchronizer's ledger {self.path}: {exc}", field="synchronizer.ledger"
            ) from exc
        self._saved, self._saved_synced = snapshot, fsync

    def _encode(self, snapshot: Snapshot) -> dict[str, Any]:
        # The tensor list of a large model is long; encode a version once, not at every step.
        if self._latest_json is None or self._latest_json[0] is not snapshot.latest:
            self._latest_json = (snapshot.latest, _version_json(snapshot.latest))
        return {
            "format": FORMAT,
            "saved_at": time.time(),
            "latest": self._latest_json[1],
            "members": [vars(r) for r in snapshot.members],
        }


def _version_json(v: Version) -> dict[str, Any]:
    return {
        "version": v.version,
        "checkpoint_path": v.checkpoint_path,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256, "crc32": f.crc32} for f in v.files],
        "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in v.tensors],
        "published_at": v.published_at,
    }


def _decode(raw: Any) -> Snapshot:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"expected a JSON object with format {FORMAT}, got format {got!r}")
    v = raw["latest"]
    latest = Version(
        int(v["version"]),
        str(v["checkpoint_path"]),
        tuple(
            FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"]), _optional_int(f.get("crc32")))
            for f in v["files"]
        ),
        tuple(
            TensorEntry(str(t["name"]), str(t["dtype"]), tuple(int(d) for d in t["shape"]))
            for t in v["tensors"]
        ),
        float(v["published_at"]),
    )
    members = tuple(
        MemberRecord(
            str(m["member_id"]), str(m["role"]), int(m["step"]), int(m["held"]), int(m["last_sync_step"])
        )
        for m in raw["members"]
    )
    return Snapshot(latest, members)


def _optional_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]
