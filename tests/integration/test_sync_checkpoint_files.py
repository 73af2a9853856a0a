"""Checkpoint files of sync_method checkpoint on a real disk: refused when they differ from the
published manifest, never loaded half-written, pruned only when they are sync-only."""

from __future__ import annotations

import pathlib

import pytest
import torch

from services.common import errors
from services.explorer.engines.weights import list_step_dirs
from services.synchronizer.transfer import checkpoint as ckpt


def weights(version: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(version)
    return {
        "layer.weight": torch.randn(32, 16, generator=gen),
        "layer.bias": torch.randn(16, generator=gen).to(torch.bfloat16),
        "step": torch.tensor([version]),
    }


def same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)) for k in a
    )


def flip_last_byte(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # inside the last tensor's data: same size, other checksum
    path.write_bytes(bytes(data))


def truncate(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes()[:-8])  # a copy that stopped short


DAMAGE = {
    "weights_flipped": ("model.safetensors", flip_last_byte, "does not match its CRC-32 in the manifest"),
    "weights_truncated": ("model.safetensors", truncate, "bytes, the manifest says"),
    "weights_missing": ("model.safetensors", pathlib.Path.unlink, "lacks model.safetensors"),
    "config_flipped": ("config.json", flip_last_byte, "does not match its CRC-32 in the manifest"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_explorer_refuses_a_checkpoint_that_differs_from_its_manifest(
    tmp_path: pathlib.Path, damage: str
) -> None:
    name, spoil, message = DAMAGE[damage]
    path, files = ckpt.write_checkpoint(weights(2), tmp_path, 2, config={"version": 2})
    spoil(path / name)
    held = weights(1)  # the explorer's model, at version 1
    with pytest.raises(errors.FailedPrecondition, match=message) as refused:
        ckpt.load_checkpoint(path, files, into=held)  # what WeightReceiver.receive runs
    assert name in str(refused.value) and str(path) in str(refused.value)  # names the file
    assert same_bits(held, weights(1))  # nothing of the refused checkpoint reached the model


def test_manifest_checksums_travel_through_the_wire_and_sha256_manifests_still_verify(
    tmp_path: pathlib.Path,
) -> None:
    import hashlib
    import zlib

    from services.synchronizer.convert import files_from_pb, files_to_pb
    from services.synchronizer.ledger import FileEntry

    path, files = ckpt.write_checkpoint(weights(2), tmp_path, 2)
    weights_entry = next(f for f in files if f.path == ckpt.WEIGHTS_FILE)
    assert (
        weights_entry.crc32 == zlib.crc32((path / ckpt.WEIGHTS_FILE).read_bytes())
        and not weights_entry.sha256
    )
    assert tuple(files_from_pb(files_to_pb(files))) == files  # the manifest as explorers receive it
    # a manifest from an older writer, with SHA-256 digests and no CRC-32, is checked with SHA-256
    older = tuple(
        FileEntry(f.path, f.size, hashlib.sha256((path / f.path).read_bytes()).hexdigest()) for f in files
    )
    assert same_bits(ckpt.load_checkpoint(path, older), weights(2))
    flip_last_byte(path / ckpt.WEIGHTS_FILE)
    with pytest.raises(errors.FailedPrecondition, match="does not match its SHA-256 in the manifest"):
        ckpt.load_checkpoint(path, older)
    no_checksum = tuple(FileEntry(f.path, f.size) for f in files)
    with pytest.raises(errors.FailedPrecondition, match="does not match"):
        ckpt.load_checkpoint(path, no_checksum)  # a manifest without a checksum verifies nothing: refused


def test_a_checkpoint_whose_shapes_differ_leaves_the_model_alone(tmp_path: pathlib.Path) -> None:
    path, files = ckpt.write_checkpoint(weights(2), tmp_path, 2)
    held = {**weights(1), "step": torch.tensor([1, 1])}  # the last tensor's shape differs
    with pytest.raises(errors.FailedPrecondition, match="step: checkpoint has"):
        ckpt.load_checkpoint(path, files, into=held)
    assert same_bits(
        {k: v for k, v in held.items() if k != "step"}, {k: v for k, v in weights(1).items() if k != "step"}
    )


def test_a_half_written_checkpoint_is_never_seen_as_one(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt.write_checkpoint(weights(1), tmp_path, 1)
    # A writer that fails before the rename (here: while writing the manifest) leaves nothing behind.
    real_write_small = ckpt._write_small

    def fail_on_manifest(path: pathlib.Path, data: bytes):  # type: ignore[no-untyped-def]
        if path.name == ckpt.MANIFEST_FILE:
            raise OSError("disk full")
        return real_write_small(path, data)

    monkeypatch.setattr(ckpt, "_write_small", fail_on_manifest)
    with pytest.raises(OSError, match="disk full"):
        ckpt.write_checkpoint(weights(2), tmp_path, 2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1"]
    # A writer SIGKILLed mid-write leaves its temporary directory as it was: weights cut short,
    # no manifest. Nothing that looks for versions takes it for one ...
    dead = tmp_path / ".global_step_3.tmp-deadbeef"
    dead.mkdir()
    (dead / ckpt.WEIGHTS_FILE).write_bytes(
        (ckpt.step_dir(tmp_path, 1) / ckpt.WEIGHTS_FILE).read_bytes()[:100]
    )
    assert list_step_dirs(str(tmp_path)) == [(1, str(ckpt.step_dir(tmp_path, 1)))]  # bench-mode discovery
    with pytest.raises(FileNotFoundError):
        ckpt.read_manifest(dead)  # and it has no manifest a publisher could announce
    # ... and the next publish's pruning removes it.
    assert ckpt.prune_sync_checkpoints(tmp_path, keep_newest=2, keep_at_least=0) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1"]


def test_pruning_deletes_only_old_sync_checkpoints_no_live_explorer_holds(tmp_path: pathlib.Path) -> None:
    for step in (1, 2, 3, 4, 5):
        ckpt.write_checkpoint(weights(step), tmp_path, step)
    # a directory without the SYNC_ONLY marker (copied in by hand) is never the pruner's to delete
    (ckpt.step_dir(tmp_path, 2) / ckpt.SYNC_ONLY_MARKER).unlink()
    # the trainer's full checkpoints live apart (services/trainer/checkpoint.py) and are not touched
    full = tmp_path / "checkpoints" / "full" / "global_step_1"
    full.mkdir(parents=True)
    # keep the 2 newest (4, 5) and anything >= 3, the oldest version a live explorer holds
    assert ckpt.prune_sync_checkpoints(tmp_path, keep_newest=2, keep_at_least=3) == [1]
    assert [s for s, _ in list_step_dirs(str(tmp_path))] == [2, 3, 4, 5]
    assert full.is_dir()
    assert ckpt.prune_sync_checkpoints(tmp_path, keep_newest=1, keep_at_least=5) == [3, 4]
    assert [s for s, _ in list_step_dirs(str(tmp_path))] == [2, 5]


def test_a_checkpoint_loaded_without_into_is_mapped_from_its_file_not_copied(tmp_path: pathlib.Path) -> None:
    """The explorer's receive path: the tensors are the file's pages (read as used), so loading a
    checkpoint does not hold it once more in memory; they stay valid when the directory is pruned."""
    import shutil

    path, files = ckpt.write_checkpoint(weights(3), tmp_path, 3)
    loaded = ckpt.load_checkpoint(path, files)
    weights_file = str((path / ckpt.WEIGHTS_FILE).resolve())
    spans = []
    for line in pathlib.Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(weights_file):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            spans.append((start, end))
    assert spans and all(any(a <= t.data_ptr() < b for a, b in spans) for t in loaded.values())
    shutil.rmtree(path)  # pruned while an engine still holds the tensors
    assert same_bits(loaded, weights(3))
