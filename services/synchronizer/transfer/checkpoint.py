"""Weights as files: atomic safetensors checkpoints with a verified manifest (sync_method checkpoint).

Write (trainer): tensors go to `<root>/.global_step_N.tmp-<id>/model.safetensors` in the
safetensors format, written by hand from each tensor's own memory (no serialized copy of the whole
dict) while a second thread checksums the same bytes (zlib's CRC-32); then `config.json` (optional) and
`manifest.json`, and a rename to `global_step_N`. A reader therefore sees either no directory or a
complete one (rename is atomic, and a killed writer's files stay in the page cache).

No fsync: a sync checkpoint only hands weights to explorers now. Against a power loss, which
kills every process anyway, the manifest's checksums, verified on every load, already refuse a
torn file, and the trainer re-publishes from its own full checkpoint. Forcing
~0.5 GB to disk cost ~0.45 s per sync here, about as much as writing and reading it. Every such checkpoint carries a `SYNC_ONLY` marker, and the pruner deletes only
marked directories. The trainer's full checkpoints (weights, optimizer, data cursor) are another
thing in another place, `<run_dir>/checkpoints/full/` (services/trainer/checkpoint.py), kept by
trainer.max_checkpoints_to_keep; nothing here touches them.

Load (explorer): check sizes, checksum the file through a memory map while the same pages are
read, and refuse the checkpoint if any checksum differs from the manifest the synchronizer
published, before a byte reaches the destination tensors. CRC-32 rather than SHA-256: the check
is against torn, truncated or replaced files, not tampering, and it runs at ~3.5 GB/s a core here
where SHA-256 runs at 1.5 (two SHA-256 passes cost more than writing and reading the weights). A
manifest with a sha256 (an older writer) is still checked with SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import threading
import uuid
import zlib
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import Any

import torch

from services.common import errors
from services.synchronizer.ledger import FileEntry

WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
SYNC_ONLY_MARKER = "SYNC_ONLY"
CHUNK_BYTES = 16 << 20

_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy when it is contiguous on CPU (one copy otherwise)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(b"")


def _header(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in state_dict.items():
        if tensor.dtype not in _ST_DTYPES:
            raise errors.InvalidArgument(
                f"dtype {tensor.dtype} of {name!r} cannot go into safetensors", field=name
            )
        size = tensor.numel() * tensor.element_size()
        entries[name] = {
            "dtype": _ST_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format wants the data 8-byte aligned
    return len(raw).to_bytes(8, "little") + raw


def _write_hashed(path: Path, chunks: Iterable[memoryview]) -> FileEntry:
    """Write `chunks` to `path`, checksumming them (CRC-32) in a second thread."""
    crc = 0
    queue: Queue[memoryview | None] = Queue(maxsize=8)

    def hasher() -> None:
        nonlocal crc
        while (item := queue.get()) is not None:
            crc = zlib.crc32(item, crc)  # releases the GIL for large buffers

    thread = threading.Thread(target=hasher, daemon=True)
    thread.start()
    size = 0
    try:
        with open(path, "wb") as out:
            for chunk in chunks:
                for start in range(0, len(chunk), CHUNK_BYTES):
                    piece = chunk[start : start + CHUNK_BYTES]
                    queue.put(piece)
                    out.write(piece)
                    size += len(piece)
    finally:
        queue.put(None)
        thread.join()
    return FileEntry(path.name, size, crc32=crc)


def _write_small(path: Path, data: bytes) -> FileEntry:
    path.write_bytes(data)
    return FileEntry(path.name, len(data), crc32=zlib.crc32(data))


def _checksum_matches(data: Any, entry: FileEntry) -> bool:
    """`data` (bytes-like) against the entry's SHA-256, else its CRC-32; no checksum at all fails."""
    if entry.sha256:
        return hashlib.sha256(data).hexdigest() == entry.sha256
    return entry.crc32 is not None and zlib.crc32(data) == entry.crc32


def write_checkpoint(
    state_dict: Mapping[str, torch.Tensor],
    root: str | os.PathLike[str],
    step: int,
    *,
    config: Mapping[str, object] | None = None,
) -> tuple[Path, tuple[FileEntry, ...]]:
    """Atomically write `state_dict` as `<root>/global_step_<step>/`; returns (dir, manifest)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".global_step_{step}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        views = [_byte_view(t) for t in state_dict.values()]
        files = [_write_hashed(tmp / WEIGHTS_FILE, [memoryview(_header(state_dict)), *views])]
        if config is not None:
            files.append(_write_small(tmp / "config.json", json.dumps(dict(config), indent=1).encode()))
        _write_small(tmp / SYNC_ONLY_MARKER, b"weights written for a sync; may be pruned\n")
        manifest = {"step": step, "files": [f.__dict__ for f in files]}
        _write_small(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1).encode())
        if final.exists():  # a re-publish of the same step (e.g. after a trainer restart)
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, tuple(files)


def read_manifest(path: str | os.PathLike[str]) -> tuple[FileEntry, ...]:
    """The manifest a checkpoint carries (used when the synchronizer's copy is not at hand)."""
    data = json.loads((Path(path) / MANIFEST_FILE).read_text())
    return tuple(FileEntry(**f) for f in data["files"])


def verify_files(path: str | os.PathLike[str], files: Iterable[FileEntry]) -> None:
    """Check size and checksum of every listed file; FailedPrecondition names the first bad one."""
    for entry in files:
        _check(Path(path), entry, hash_file=True)


def _check(path: Path, entry: FileEntry, *, hash_file: bool) -> Path:
    target = path / entry.path
    if not target.is_file():
        raise errors.FailedPrecondition(f"checkpoint {path} lacks {entry.path}", field="checkpoint_path")
    size = target.stat().st_size
    if size != entry.size:
        raise errors.FailedPrecondition(
            f"{target} has {size} bytes, the manifest says {entry.size} (incomplete or replaced)",
            field="files",
        )
    if hash_file:
        with open(target, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if not _checksum_matches(mapped, entry):
                kind = "SHA-256" if entry.sha256 else "CRC-32"
                raise errors.FailedPrecondition(
                    f"{target} does not match its {kind} in the manifest", field="files"
                )
    return target


def load_checkpoint(
    path: str | os.PathLike[str],
    files: Iterable[FileEntry] | None = None,
    *,
    into: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Verify and load the weights of a checkpoint.

    `files` is the manifest published by the synchronizer (None: the one in the directory).
    With `into`, tensors are copied in place into those tensors (names and shapes must match) and
    `into` is returned. Otherwise the tensors are safetensors' own, mapped from the file (copy on
    write, paged in as they are read): a receiver copies them into its engine anyway, and a copy
    here would hold the whole checkpoint once more in memory (the explorer's peak while it loads).
    A checkpoint is never rewritten in place (a re-publish replaces the directory), so the mapping
    keeps the verified bytes.
    """
    from safetensors.torch import load_file

    path = Path(path)
    files = tuple(files) if files is not None else read_manifest(path)
    weights = next((f for f in files if f.path == WEIGHTS_FILE), None)
    if weights is None:
        raise errors.FailedPrecondition(f"manifest of {path} lists no {WEIGHTS_FILE}", field="files")
    for entry in files:
        if entry is not weights:
            _check(path, entry, hash_file=True)
    target = _check(path, weights, hash_file=False)
    with ThreadPoolExecutor(1) as pool:  # hash while the same (cached) pages are read
        digest = pool.submit(lambda: _check(path, weights, hash_file=True))
        loaded = load_file(str(target))
        digest.result()  # before `into` is touched: a refused checkpoint leaves the model as it was
    return _copy_into(loaded, into) if into is not None else dict(loaded)


def _copy_into(
    loaded: Mapping[str, torch.Tensor], into: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    missing = sorted(set(into) - set(loaded))
    extra = sorted(set(loaded) - set(into))
    if missing or extra:
        raise errors.FailedPrecondition(
            f"checkpoint tensors differ from the model: missing {missing[:5]}, extra {extra[:5]}"
        )
    for name, dst in into.items():  # all checked before any is copied
        src = loaded[name]
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise errors.FailedPrecondition(
                f"{name}: checkpoint has {src.dtype}{list(src.shape)}, model has {dst.dtype}{list(dst.shape)}",
                field=name,
            )
    with torch.no_grad():
        for name, dst in into.items():
            dst.copy_(loaded[name])
    return dict(into)


def prune_sync_checkpoints(
    root: str | os.PathLike[str], *, keep_newest: int, keep_at_least: int
) -> list[int]:
    """Delete sync-only checkpoints except the newest `keep_newest` and any step >= `keep_at_least`
    (the oldest version a live explorer still holds). Returns the deleted steps."""
    root = Path(root)
    steps = sorted(
        int(p.name.removeprefix("global_step_"))
        for p in root.glob("global_step_*")
        if p.name.removeprefix("global_step_").isdigit() and (p / SYNC_ONLY_MARKER).exists()
    )
    doomed = [s for s in steps[: max(0, len(steps) - keep_newest)] if s < keep_at_least]
    for step in doomed:
        shutil.rmtree(step_dir(root, step), ignore_errors=True)
    for stale in root.glob(".global_step_*.tmp-*"):  # leftovers of a writer that died
        shutil.rmtree(stale, ignore_errors=True)
    return doomed
