"""Domain records <-> protobuf messages of the synchronizer (used by the servicer and the client)."""

from __future__ import annotations

from collections.abc import Iterable

from services.synchronizer.ledger import EXPLORER, TRAINER, FileEntry, Group, Member, TensorEntry, Version
from services.synchronizer.plan import Plan
from trinity_grpc.common.v1 import common_pb2
from trinity_grpc.synchronizer.v1 import synchronizer_pb2 as pb

ROLE_TO_PB = {TRAINER: pb.ROLE_TRAINER, EXPLORER: pb.ROLE_EXPLORER}
ROLE_FROM_PB = {v: k for k, v in ROLE_TO_PB.items()}


def version_to_pb(version: Version) -> common_pb2.ModelVersion:
    return common_pb2.ModelVersion(
        version=version.version, checkpoint_path=version.checkpoint_path, published_at=version.published_at
    )


def version_from_pb(
    msg: common_pb2.ModelVersion,
    files: Iterable[pb.FileManifest | FileEntry] = (),
    tensors: Iterable[pb.TensorManifest | TensorEntry] = (),
) -> Version:
    return Version(
        msg.version,
        msg.checkpoint_path,
        tuple(files_from_pb(files)),
        tuple(tensors_from_pb(tensors)),
        msg.published_at,
    )


def files_to_pb(files: Iterable[FileEntry]) -> list[pb.FileManifest]:
    return [pb.FileManifest(path=f.path, size=f.size, sha256=f.sha256, crc32=f.crc32) for f in files]


def files_from_pb(files: Iterable[pb.FileManifest | FileEntry]) -> list[FileEntry]:
    """Manifest entries from messages (domain entries, as a publisher already holds them, pass as they are)."""
    return [
        f
        if isinstance(f, FileEntry)
        else FileEntry(f.path, f.size, f.sha256, f.crc32 if f.HasField("crc32") else None)
        for f in files
    ]


def tensors_to_pb(tensors: Iterable[TensorEntry]) -> list[pb.TensorManifest]:
    return [pb.TensorManifest(name=t.name, dtype=t.dtype, shape=list(t.shape)) for t in tensors]


def tensors_from_pb(tensors: Iterable[pb.TensorManifest | TensorEntry]) -> list[TensorEntry]:
    return [TensorEntry(t.name, t.dtype, tuple(t.shape)) for t in tensors]


def plan_to_pb(plan: Plan) -> pb.SyncPlan:
    return pb.SyncPlan(
        sync_interval=plan.interval,
        sync_offset=plan.offset,
        sync_timeout=plan.timeout,
        sync_style=plan.style,
        sync_method=plan.method,
        max_staleness=plan.max_staleness or 0,
        explorer_sync_interval=plan.explorer_interval,
        trainer_sync_interval=plan.trainer_interval,
    )


def plan_from_pb(msg: pb.SyncPlan) -> Plan:
    return Plan(
        interval=msg.sync_interval,
        offset=msg.sync_offset,
        timeout=msg.sync_timeout,
        style=msg.sync_style,
        method=msg.sync_method,
        max_staleness=msg.max_staleness or None,
        explorer_interval=msg.explorer_sync_interval,
        trainer_interval=msg.trainer_sync_interval,
    )


def member_to_pb(member: Member, now: float) -> pb.MemberStatus:
    return pb.MemberStatus(
        member_id=member.member_id,
        role=ROLE_TO_PB[member.role],
        step=member.step,
        model_version=member.held,
        alive=member.alive,
        last_seen_s=max(0.0, now - member.last_seen),
        last_sync_error=member.last_sync_error,
    )


def group_to_pb(group: Group) -> pb.WeightGroupStatus:
    return pb.WeightGroupStatus(
        group_name=group.name,
        version=group.version,
        state=group.state,
        members=group.members,
        error=group.error,
    )
