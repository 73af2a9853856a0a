"""The synchronizer's gRPC-free core: plan + ledger + liveness + rendezvous, in plain asyncio.

Every wait (an explorer held by the plan, a rank waiting for rank 0 to open the group, a reader
waiting for a version) is a loop on one asyncio.Condition with a deadline of `plan.timeout`
seconds; it ends with DeadlineExceeded naming what it waited for, or FailedPrecondition when the
group it waits on failed (a member died or reported a failed transfer). No torch, no grpc.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from services.common import errors
from services.synchronizer import plan as P
from services.synchronizer.ledger import (
    DONE,
    EXPLORER,
    FAILED,
    OPEN,
    TRAINER,
    FileEntry,
    Group,
    Ledger,
    Member,
    TensorEntry,
    Version,
)
from services.synchronizer.store import LedgerStore, NullStore, Snapshot

_T = TypeVar("_T")


@dataclass(frozen=True)
class ExplorerDecision:
    """Answer to BeginExplorerStep: load `load` (None: run with what you hold) — and why."""

    load: Version | None
    reason: str


@dataclass(frozen=True)
class Assignment:
    """This member's place in a weight group."""

    group: Group
    rank: int
    tensors: tuple[TensorEntry, ...]
    bucket_bytes: int


class Synchronizer:
    """See the module docstring. `clock` is injectable for liveness tests (seconds, monotonic).

    `store` keeps the durable part of the ledger (services/synchronizer/store.py): it is loaded
    here, written before a publish is acknowledged, and rewritten when a member's step, held
    version or registration changes (heartbeats do not write)."""

    def __init__(
        self,
        plan: P.Plan,
        *,
        member_timeout_s: float = 10.0,
        bucket_bytes: int = 256 << 20,
        clock: Callable[[], float] = time.monotonic,
        store: LedgerStore | None = None,
    ) -> None:
        self.plan = plan
        self.member_timeout_s = member_timeout_s
        self.bucket_bytes = bucket_bytes
        self.store = store or NullStore()
        self._clock = clock
        saved = self.store.load()
        self.ledger = saved.restore(clock()) if saved is not None else Ledger()
        self._changed = asyncio.Condition()

    def _persist(self, *, latest: Version | None = None, fsync: bool = False) -> None:
        """Write the durable part of the ledger (with `latest` as the newest version when given)."""
        self.store.save(Snapshot.of(self.ledger, latest), fsync=fsync)

    # -- waits ---------------------------------------------------------------------------------
    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait(self, predicate: Callable[[], _T], what: str, timeout: float | None = None) -> _T:
        """Wait until `predicate()` is truthy (returning it) or fail after the sync timeout."""
        limit = self.plan.timeout if timeout is None else timeout
        async with self._changed:
            try:
                return await asyncio.wait_for(self._changed.wait_for(predicate), limit)
            except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                raise errors.DeadlineExceeded(
                    f"waited {limit:g}s (synchronizer.sync_timeout) for {what}",
                    field="synchronizer.sync_timeout",
                ) from None

    def _member(self, member_id: str, role: str | None = None) -> Member:
        member = self.ledger.members.get(member_id)
        if member is None:
            raise errors.NotFound(
                f"member {member_id!r} is not registered; call Register first", field="member_id"
            )
        if role is not None and member.role != role:
            raise errors.FailedPrecondition(
                f"member {member_id!r} is a {member.role}, not a {role}", field="member_id"
            )
        member.last_seen = self._clock()
        member.alive = True
        return member

    # -- membership and liveness ---------------------------------------------------------------
    async def register(self, member_id: str, role: str) -> tuple[Version, int]:
        """Join or rejoin; returns (latest version, last completed step of this member)."""
        if not member_id:
            raise errors.InvalidArgument("member_id must not be empty", field="member_id")
        if role not in (TRAINER, EXPLORER):
            raise errors.InvalidArgument(f"role must be trainer or explorer, got {role!r}", field="role")
        trainer = self.ledger.trainer()
        if role == TRAINER and trainer is not None and trainer.member_id != member_id and trainer.alive:
            raise errors.AlreadyExists(
                f"trainer {trainer.member_id!r} is registered and alive", field="member_id"
            )
        member = self.ledger.members.get(member_id)
        if member is None:
            member = self.ledger.members[member_id] = Member(member_id, role, last_seen=self._clock())
        elif member.role != role:
            raise errors.AlreadyExists(f"member {member_id!r} registered as {member.role}", field="role")
        else:  # a restart: it lost its weights, keep its step
            self.ledger.fail_groups_of(member_id, f"member {member_id!r} restarted")
            member.incarnations += 1
            member.held = member.attempted = 0
            member.requested = False
        member.alive, member.last_seen = True, self._clock()
        self._persist()
        await self._notify()
        return self.ledger.latest, member.step

    async def heartbeat(self, member_id: str, step: int, held: int) -> int:
        member = self._member(member_id)
        member.step = max(member.step, step)
        member.held = held
        return self.ledger.latest.version

    async def mark_dead(self, member_id: str, why: str, incarnation: int | None = None) -> None:
        """A member stopped (heartbeat stream broke, or no beat for member_timeout_s). With
        `incarnation`, only that incarnation: the stream of a killed process may close after the
        restarted one registered."""
        member = self.ledger.members.get(member_id)
        if (
            member is None
            or not member.alive
            or (incarnation is not None and incarnation != member.incarnations)
        ):
            return
        member.alive = False
        member.requested = False
        self.ledger.fail_groups_of(member_id, f"member {member_id!r} died during the sync ({why})")
        await self._notify()

    async def sweep(self) -> list[str]:
        """Mark members dead whose last beat is older than member_timeout_s; returns their ids."""
        now = self._clock()
        dead = [
            m.member_id
            for m in self.ledger.members.values()
            if m.alive and now - m.last_seen > self.member_timeout_s
        ]
        for member_id in dead:
            await self.mark_dead(member_id, f"no heartbeat for {self.member_timeout_s:g}s")
        return dead

    async def run_sweeper(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            await self.sweep()

    # -- the plan ------------------------------------------------------------------------------
    def _explorer_wants(self, member: Member, step: int) -> tuple[int, int, str]:
        """(version it must reach before `step`, staleness floor, reason); -1 = no sync wanted."""
        plan, latest = self.plan, self.ledger.latest.version
        known = max(member.held, member.attempted)
        floor = P.staleness_floor(plan, step, self.ledger.trainer_done())
        need, reason = -1, ""
        if plan.style == "fixed":
            required = P.fixed_required_version(plan, step)
            if required > known:
                need, reason = required, f"sync point after step {step - 1}: needs version >= {required}"
        elif plan.style == "dynamic_by_trainer":
            if latest > known:
                need, reason = latest, f"trainer published version {latest}"
        elif plan.style == "fully_async":
            if P.async_check_due(plan, step, member.last_sync_step) and latest > known:
                since = step - 1 - member.last_sync_step
                need, reason = (
                    latest,
                    f"fully_async: {since} steps since last sync, version {latest} published",
                )
        elif P.explorer_due(plan, step, member.last_sync_step):
            if latest > known:
                need, reason = latest, f"{step - 1 - member.last_sync_step} steps since last sync"
            else:
                member.requested = True  # the trainer publishes after its next step
        group = self.ledger.group_for(member.member_id, known) if plan.method == "nccl" and need < 0 else None
        if group is not None and not self._scheduled_later(group.version, step):
            need, reason = group.version, f"member of weight group {group.name}"
        if floor > member.held:
            member.requested = True
            need, reason = max(need, floor), f"max_staleness {plan.max_staleness}: needs version >= {floor}"
        return need, floor, reason

    def _scheduled_later(self, version: int, step: int) -> bool:
        """fixed: is `version` one the plan makes the explorer sync to at a later sync point? Its
        group then waits for that point (joining at an earlier boundary would run steps with a
        newer version than the plan says, when one explorer is slower than the other)."""
        plan = self.plan
        return (
            plan.style == "fixed"
            and version % plan.interval == 0
            and version > P.fixed_required_version(plan, step)
        )

    def _deliverable(self, member: Member, need: int) -> Version | None:
        """The version `member` can load now to satisfy `need`, or None."""
        latest = self.ledger.latest
        if self.plan.method == "checkpoint":
            return latest if latest.version >= need and latest.version > member.held else None
        group = self.ledger.group_for(member.member_id, max(member.held, member.attempted))
        if group is not None and group.version >= need:
            return latest if latest.version == group.version else Version(group.version)
        return None

    async def begin_explorer_step(self, member_id: str, step: int, held: int) -> ExplorerDecision:
        """Hold or release explorer `member_id` before its step `step` (see plan.py)."""
        if step < 1:
            raise errors.InvalidArgument("step is 1-based", field="step")
        member = self._member(member_id, EXPLORER)
        member.step, member.held = max(member.step, step - 1), held
        self._persist()
        need, floor, reason = self._explorer_wants(member, step)
        await self._notify()
        if need < 0:
            return ExplorerDecision(None, "no sync due")
        ready = self._deliverable(member, need)
        if (
            ready is None
            and self.plan.method == "nccl"
            and self.ledger.latest.version >= need
            and floor <= held
        ):
            # The version exists but no open group includes this member (it restarted, or its group
            # failed): run on, and have the trainer publish again after its next step.
            member.requested = True
            await self._notify()
            return ExplorerDecision(
                None, f"{reason}; no open weight group includes {member_id}, asked for a re-publish"
            )
        if ready is None:
            waited = await self._wait(
                lambda: "dead" if not member.alive else self._deliverable(member, need),
                f"version >= {need} for {member_id} before step {step} ({reason})",
            )
            if isinstance(waited, str):
                raise errors.FailedPrecondition(
                    f"{member_id} was declared dead while held", field="member_id"
                )
            ready = waited
        return ExplorerDecision(ready, reason)

    async def begin_trainer_step(self, member_id: str, step: int) -> bool:
        member = self._member(member_id, TRAINER)
        member.step = max(member.step, step - 1)
        self._persist()
        return P.predicted_publish(self.plan, step, self.ledger.latest.version, self.ledger.any_request())

    async def end_trainer_step(self, member_id: str, step: int) -> tuple[bool, str]:
        member = self._member(member_id, TRAINER)
        member.step = max(member.step, step)
        self._persist()
        await self._notify()  # staleness floors depend on the trainer's progress
        return P.trainer_publishes(self.plan, step, self.ledger.latest.version, self.ledger.any_request())

    # -- versions ------------------------------------------------------------------------------
    async def publish_version(
        self,
        member_id: str,
        version: int,
        checkpoint_path: str = "",
        files: tuple[FileEntry, ...] = (),
        tensors: tuple[TensorEntry, ...] = (),
    ) -> Version:
        """Record a new version; under nccl, form the group of the explorers that will load it."""
        member = self._member(member_id, TRAINER)
        latest = self.ledger.latest
        if version == latest.version and version > 0 and checkpoint_path == latest.checkpoint_path:
            return latest  # a retried publish
        if version <= latest.version:
            raise errors.FailedPrecondition(
                f"version {version} is not newer than the latest published {latest.version}", field="version"
            )
        if self.plan.method == "checkpoint" and not (checkpoint_path and files):
            raise errors.InvalidArgument(
                "sync_method checkpoint needs checkpoint_path and files", field="files"
            )
        published = Version(version, checkpoint_path, tuple(files), tuple(tensors), time.time())
        member.step = max(member.step, version)
        self._persist(latest=published, fsync=True)  # on disk before it is acknowledged (or recorded)
        self.ledger.latest = published
        if self.plan.method == "nccl":
            explorers = self.ledger.explorers()
            if self.plan.style == "dynamic_by_explorer":
                explorers = [m for m in explorers if m.requested]
            elif self.plan.style == "fully_async":  # those that will load it at their next boundary
                explorers = [
                    m
                    for m in explorers
                    if m.requested or P.async_due_next(self.plan, m.step, m.last_sync_step)
                ]
            if explorers:
                self.ledger.new_group(version, member_id, [m.member_id for m in explorers])
        for explorer in self.ledger.explorers():
            explorer.requested = False
        await self._notify()
        return published

    async def wait_for_version(self, min_version: int, timeout: float | None = None) -> Version:
        got = await self._wait(
            lambda: self.ledger.latest.version >= min_version and self.ledger.latest,
            f"version >= {min_version} to be published",
            timeout,
        )
        return got  # type: ignore[return-value]

    # -- weight groups -------------------------------------------------------------------------
    async def join_weight_group(
        self, member_id: str, version: int, master_address: str = "", master_port: int = 0, backend: str = ""
    ) -> Assignment:
        """Rank 0 opens the group (says where its store listens); the others wait for that."""
        self._member(member_id)
        group = self.ledger.latest_group(version)
        if group is None or member_id not in group.members:
            raise errors.FailedPrecondition(
                f"no weight group for version {version} includes {member_id!r} "
                "(groups are formed when the trainer publishes)",
                field="version",
            )
        if group.rank_of(member_id) == 0 and group.state == "forming":
            if not master_address or master_port <= 0:
                raise errors.InvalidArgument(
                    "rank 0 must give master_address and master_port", field="master_port"
                )
            group.master_address, group.master_port = master_address, master_port
            group.backend = backend or "gloo"
            group.state = OPEN
            await self._notify()
        opened = await self._wait(lambda: group.state != "forming", f"rank 0 to open {group.name}")
        if group.state == FAILED or not opened:
            raise errors.FailedPrecondition(
                f"weight group {group.name} failed: {group.error}", field="version"
            )
        tensors = self.ledger.latest.tensors if self.ledger.latest.version == version else ()
        return Assignment(group, group.rank_of(member_id), tensors, self.bucket_bytes)

    async def report_sync(self, member_id: str, version: int, ok: bool, error: str = "") -> None:
        member = self._member(member_id)
        group = self.ledger.latest_group(version) if self.plan.method == "nccl" else None
        if member.role == EXPLORER:
            member.attempted = max(member.attempted, version)
            if ok:
                member.held, member.last_sync_step, member.last_sync_error = version, member.step, ""
                member.requested = False
            else:
                member.last_sync_error = error or "unknown error"
            self._persist()
        if group is not None and member_id in group.members:
            if not ok:
                group.fail(f"{member_id}: {error or 'transfer failed'}")
            elif group.active:
                group.reported_ok.add(member_id)
                if group.reported_ok >= set(group.members):
                    group.state = DONE
        await self._notify()

    def status(self) -> tuple[Version, list[Member], list[Group], float]:
        """(latest, members, recent groups, now) for GetStatus."""
        return self.ledger.latest, list(self.ledger.members.values()), list(self.ledger.groups), self._clock()
