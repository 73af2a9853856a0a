"""The synchronizer's durable ledger (services/synchronizer/store.py) under the real core.

Decided and checked here: a missing file is a fresh run (version 0); an unreadable file stops the
synchronizer with FailedPrecondition naming the file (it never silently restarts from version 0);
a stray temp file of a write that was cut short is ignored; a publish is on disk, fsynced, before
the core records it, and a failed write leaves both the file and the ledger as they were.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from services.common import errors
from services.synchronizer import plan as P
from services.synchronizer import store as S
from services.synchronizer.core import Synchronizer
from services.synchronizer.ledger import FileEntry, TensorEntry, Version

FILES = (
    FileEntry("model.safetensors", 1234, crc32=0xDEADBEEF),
    FileEntry("config.json", 56, "cd" * 32),
)  # both checksum kinds
TENSORS = (TensorEntry("embed.weight", "bfloat16", (64, 32)), TensorEntry("step", "int64", (1,)))


def path_in(tmp_path: pathlib.Path) -> str:
    return S.ledger_path(str(tmp_path / "run"))


async def ledger_with_two_versions(path: str) -> Synchronizer:
    sync = Synchronizer(P.Plan(method="checkpoint", timeout=5), store=S.JsonFileStore(path))
    await sync.register("trainer", "trainer")
    await sync.register("explorer-0", "explorer")
    for step in (1, 2):
        await sync.begin_trainer_step("trainer", step)
        await sync.end_trainer_step("trainer", step)
        await sync.publish_version("trainer", step, f"/ckpt/global_step_{step}", FILES)
    decision = await sync.begin_explorer_step("explorer-0", 2, held=0)
    assert decision.load is not None and decision.load.version == 2
    await sync.report_sync("explorer-0", 2, ok=True)
    await sync.begin_explorer_step("explorer-0", 3, held=2)
    return sync


async def test_round_trip_restores_the_latest_version_and_the_members(tmp_path: pathlib.Path) -> None:
    path = path_in(tmp_path)
    before = await ledger_with_two_versions(path)
    after = Synchronizer(P.Plan(method="checkpoint", timeout=5), store=S.JsonFileStore(path))
    assert after.ledger.latest == before.ledger.latest  # path, manifest and publish time
    assert after.ledger.latest.files == FILES
    restored = {
        m.member_id: (m.role, m.step, m.held, m.last_sync_step, m.alive)
        for m in after.ledger.members.values()
    }
    assert restored == {"trainer": ("trainer", 2, 0, 0, True), "explorer-0": ("explorer", 2, 2, 1, True)}
    # members carry on without registering again, and the plan continues from the restored state
    assert (await after.end_trainer_step("trainer", 3))[0] is True
    await after.publish_version("trainer", 3, "/ckpt/global_step_3", FILES)
    assert (await after.begin_explorer_step("explorer-0", 4, held=2)).load.version == 3  # type: ignore[union-attr]
    assert os.listdir(os.path.dirname(path)) == ["ledger.json"]  # no temp file left


async def test_tensor_manifest_round_trips(tmp_path: pathlib.Path) -> None:
    path = path_in(tmp_path)
    sync = Synchronizer(P.Plan(method="nccl"), store=S.JsonFileStore(path))
    await sync.register("trainer", "trainer")
    await sync.publish_version("trainer", 1, tensors=TENSORS)
    assert S.JsonFileStore(path).load().latest.tensors == TENSORS  # type: ignore[union-attr]
    assert json.loads(pathlib.Path(path).read_text())["latest"]["tensors"][0] == {
        "name": "embed.weight",
        "dtype": "bfloat16",
        "shape": [64, 32],
    }


async def test_publish_is_fsynced_steps_and_heartbeats_are_not(tmp_path: pathlib.Path, monkeypatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    store = S.JsonFileStore(path_in(tmp_path))
    sync = Synchronizer(P.Plan(method="checkpoint", timeout=5), store=store)
    await sync.register("trainer", "trainer")
    await sync.end_trainer_step("trainer", 1)
    assert synced == []
    await sync.publish_version("trainer", 1, "/ckpt/global_step_1", FILES)
    assert len(synced) == 2  # the file, then its directory (the rename)
    os.utime(store.path, ns=(0, 0))
    await sync.heartbeat("trainer", 2, 1)  # beats move the step in memory only
    await sync.heartbeat("trainer", 2, 1)
    assert os.stat(store.path).st_mtime_ns == 0
    await sync.end_trainer_step("trainer", 2)  # a step change is written (without fsync) ...
    assert os.stat(store.path).st_mtime_ns != 0 and len(synced) == 2
    assert S.JsonFileStore(store.path).load().members[0].step == 2  # type: ignore[union-attr]
    os.utime(store.path, ns=(0, 0))
    await sync.end_trainer_step("trainer", 2)  # ... and nothing durable changed here: no write
    assert os.stat(store.path).st_mtime_ns == 0


async def test_a_failed_write_is_not_acknowledged_and_keeps_the_old_ledger(
    tmp_path: pathlib.Path, monkeypatch
) -> None:
    path = path_in(tmp_path)
    sync = await ledger_with_two_versions(path)
    before = pathlib.Path(path).read_bytes()

    def disk_full(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(errors.Unavailable, match="ledger.json: .*No space left"):
        await sync.publish_version("trainer", 3, "/ckpt/global_step_3", FILES)
    assert sync.ledger.latest.version == 2  # not recorded: the trainer's retry publishes it again
    assert pathlib.Path(path).read_bytes() == before
    monkeypatch.undo()
    assert (await sync.publish_version("trainer", 3, "/ckpt/global_step_3", FILES)).version == 3
    assert S.JsonFileStore(path).load().latest.version == 3  # type: ignore[union-attr]


def test_missing_file_is_a_fresh_run(tmp_path: pathlib.Path) -> None:
    sync = Synchronizer(P.Plan(), store=S.JsonFileStore(path_in(tmp_path)))
    assert sync.ledger.latest.version == 0 and sync.ledger.members == {}
    assert not os.path.exists(path_in(tmp_path))  # nothing written until something happens


async def test_a_stray_temp_file_of_a_cut_write_is_ignored(tmp_path: pathlib.Path) -> None:
    path = path_in(tmp_path)
    await ledger_with_two_versions(path)
    pathlib.Path(path + ".tmp").write_text('{"format": 1, "lat')  # killed mid-write
    sync = Synchronizer(P.Plan(method="checkpoint", timeout=5), store=S.JsonFileStore(path))
    assert sync.ledger.latest.version == 2
    await sync.publish_version("trainer", 3, "/ckpt/global_step_3", FILES)
    assert sorted(os.listdir(os.path.dirname(path))) == ["ledger.json"]


@pytest.mark.parametrize(
    "content, why",
    [
        ('{"format": 1, "latest": {"vers', "JSONDecodeError"),
        ("[]", "format"),
        ('{"format": 99, "latest": {}, "members": []}', "format 99"),
        ('{"format": 1, "members": []}', "KeyError"),
    ],
)
def test_an_unreadable_file_stops_the_synchronizer_naming_it(
    tmp_path: pathlib.Path, content: str, why: str
) -> None:
    path = path_in(tmp_path)
    os.makedirs(os.path.dirname(path))
    pathlib.Path(path).write_text(content)
    with pytest.raises(errors.FailedPrecondition, match="move it aside") as got:
        Synchronizer(P.Plan(), store=S.JsonFileStore(path))
    assert path in str(got.value) and why in str(got.value)
    assert got.value.field == "synchronizer.ledger"


def test_null_store_keeps_nothing() -> None:
    store = S.NullStore()
    store.save(S.Snapshot(Version(3), ()), fsync=True)
    assert store.load() is None
