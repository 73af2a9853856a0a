"""Weights in place (mode colocate): trainer and explorer map the same memory, nothing is copied.

The trainer moves every parameter of its policy into a file of its own under one directory
(tmpfs `/dev/shm` where the machine has it, so the "file" is RAM), mapped MAP_SHARED, and writes a
manifest. The explorer maps the same files into its engine's model: from then on both processes
hold one copy of the weights, and the trainer's optimizer, which updates parameters in place,
updates the engine's model with them. A sync is then only the synchronizer's version ledger
moving on; no tensor travels.

One copy means the engine must never read weights the optimizer is half-way through: a lock file
holds that apart (`WeightsLock`, flock(2), released by the kernel when its holder dies). The
trainer takes it exclusively around each train step; the explorer holds it shared from the moment
a step's weights are settled until it next waits for the synchronizer. In colocate's on-policy plan
the explorer waits for version N right after writing the rows the trainer needs for step N, so the
two alternate and neither waits on the lock for long. The trainer also writes the version its
weights hold (`VERSION`) under the exclusive lock; the explorer labels what it generates with it.

What is shared: the policy's parameters. What is not: buffers (rotary tables, masks; the explorer
builds its own from the model config), the trainer's gradients and optimizer state, the reference
model, the engine's KV cache. A trainer that restarts from its checkpoint copies those weights into
the same files, so an explorer attached to them sees the resumed weights.

On a GPU the parameters stay where they are, in the trainer's CUDA memory, and the explorer opens
that memory through CUDA IPC records written beside the manifest (cuda_share.py): the same one
copy and the same lock, with the records in place of the files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

import torch

from services.common.errors import FailedPrecondition
from services.synchronizer.transfer import cuda_share

MANIFEST = "manifest.json"
LOCK = "lock"
VERSION = "VERSION"


def shm_dir(run_dir: str) -> str:
    """/dev/shm/trinity-grpc-<hash of the run dir>: the run's shared weights in RAM."""
    tag = hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:16]
    return os.path.join("/dev/shm", f"trinity-grpc-{tag}")


def disk_dir(run_dir: str) -> str:
    """`<run_dir>/shared_weights`: where they go when /dev/shm cannot hold them."""
    return os.path.join(run_dir, "shared_weights")


def shared_dir(run_dir: str, size: int = 0) -> str:
    """Where the trainer puts `size` bytes of shared weights: shm_dir when /dev/shm is a writable
    tmpfs with room for them and a quarter more (a container's default /dev/shm is 64 MiB, and
    a mapped file past a full tmpfs dies with SIGBUS, not an error), else disk_dir (page cache,
    written back to disk). The explorer is told the directory with each version."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        stat = os.statvfs(shm)
        here = shm_dir(run_dir)
        in_use = sum(e.stat().st_size for e in os.scandir(here)) if os.path.isdir(here) else 0
        if (stat.f_bavail * stat.f_frsize + in_use) >= size * 1.25:
            return here
    return disk_dir(run_dir)


def _unique_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """named_parameters() already yields a tied parameter once, under its first name."""
    return list(module.named_parameters())


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype a manifest entry names ("torch.float32")."""
    dtype: torch.dtype = getattr(torch, name.removeprefix("torch."))
    return dtype


def _map(path: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    numel = 1
    for size in shape:
        numel *= size
    return torch.from_file(path, shared=True, size=numel, dtype=dtype).view(shape)


def share_parameters(module: torch.nn.Module, directory: str, version: int) -> int:
    """Trainer: share `module`'s parameters under `directory` and write the manifest and
    `version`; returns the bytes shared. On CPU each parameter moves into a mapped file (its value
    copied once); on a GPU nothing moves: the parameters' CUDA IPC records are written instead
    (cuda_share.py), under a new `owner`."""
    os.makedirs(directory, exist_ok=True)
    params = _unique_parameters(module)
    devices = sorted({p.device.type for _, p in params})
    if devices not in (["cpu"], ["cuda"]):
        raise FailedPrecondition(
            f"mode colocate shares a policy held on one CPU or one CUDA device; this one is on {devices}",
            field="mode",
        )
    entries, total = [], 0
    share: dict[str, Any] = {}
    with torch.no_grad():
        for i, (name, param) in enumerate(params):
            shape = tuple(param.shape)
            entry: dict[str, Any] = {"name": name, "shape": list(shape), "dtype": str(param.dtype)}
            if param.device.type == "cpu":
                entry["file"] = file = f"p{i:05d}.bin"
                mapped = _map(os.path.join(directory, file), param.dtype, shape)
                mapped.copy_(param.data)
                param.data = mapped
            else:
                entry["device"] = str(param.device)
            total += param.numel() * param.element_size()
            entries.append(entry)
    if devices == ["cuda"]:
        owner = cuda_share.new_owner()
        share = {"owner": owner, "cuda_ipc": cuda_share.export([p for _, p in params], directory, owner)}
    tmp = os.path.join(directory, f".{MANIFEST}.tmp")
    with open(tmp, "w") as f:
        json.dump({"parameters": entries, **share}, f)
    os.replace(tmp, os.path.join(directory, MANIFEST))
    if share:
        cuda_share.remove_stale(directory, share["cuda_ipc"])
    write_version(directory, version)
    return total


def attach_parameters(module: torch.nn.Module, directory: str) -> int:
    """Explorer: point every parameter of `module` at the trainer's (the module is first cast to
    their dtype, and moved to their device); returns the bytes now shared. Names and shapes must
    match. CPU: the mapped files; GPU: the trainer's memory, opened from its CUDA IPC records."""
    share = read_share(directory)
    entries = {e["name"]: e for e in share["parameters"]}
    params = _unique_parameters(module)
    missing = [name for name, _ in params if name not in entries]
    if missing:
        raise FailedPrecondition(
            f"the trainer shares no parameter {missing[0]} ({len(missing)} missing): "
            "explorer and trainer must load the same model",
            field="model.model_path",
        )
    for name, param in params:
        if tuple(param.shape) != tuple(entries[name]["shape"]):
            raise FailedPrecondition(
                f"shared parameter {name} has shape {entries[name]['shape']}, the engine's {list(param.shape)}",
                field="model.model_path",
            )
    opened: dict[str, torch.Tensor] = {}
    if "cuda_ipc" in share:
        order = [e["name"] for e in share["parameters"]]
        opened = dict(zip(order, cuda_share.open_tensors(directory, share["cuda_ipc"]), strict=True))
    dtypes = {entries[name]["dtype"] for name, _ in params}
    if len(dtypes) == 1:
        module.to(dtype_of(dtypes.pop()))
    if opened:
        module.to(next(iter(opened.values())).device)  # buffers (rotary tables) beside the weights
    total = 0
    with torch.no_grad():
        for name, param in params:
            entry = entries[name]
            if opened:
                param.data = opened[name]
            else:
                shape = tuple(entry["shape"])
                param.data = _map(os.path.join(directory, entry["file"]), dtype_of(entry["dtype"]), shape)
            total += param.numel() * param.element_size()
    if opened:
        torch.cuda.empty_cache()  # the engine's own copy, now unused, back to the device
    return total


def read_share(directory: str) -> dict[str, Any]:
    """The whole manifest: "parameters" and, for a share on a GPU, "owner" and "cuda_ipc"."""
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            share: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        raise FailedPrecondition(
            f"no shared weights at {directory} (the trainer writes {MANIFEST})"
        ) from None
    return share


def owner(directory: str) -> str | None:
    """The process whose CUDA memory holds the weights (None on CPU: the files outlive it)."""
    found = read_share(directory).get("owner")
    return str(found) if found is not None else None


def host_manifest(directory: str) -> list[dict]:
    """The manifest's entries ({name, file, shape, dtype} per shared parameter, in the trainer's
    order) for an engine that copies the weights from the host files (vLLM); refused, naming the
    key, when the trainer shares CUDA memory instead."""
    share = read_share(directory)
    if "cuda_ipc" in share:
        raise FailedPrecondition(
            f"the weights at {directory} are shared on a GPU (CUDA IPC); an engine that copies them "
            "(vLLM) reads host files only: use engine_type: transformers, or mode: both",
            field="explorer.rollout_model.engine_type",
        )
    entries: list[dict] = share["parameters"]
    return entries


def mapped_tensors(directory: str) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every shared parameter, each mapped from the trainer's file: no copy is
    made, and the tensors follow the trainer's in-place updates. For an engine that loads weights
    into its own layout (vLLM): it reads them from here instead of from a checkpoint or a socket."""
    out = []
    for entry in host_manifest(directory):
        dtype = dtype_of(entry["dtype"])
        out.append(
            (entry["name"], _map(os.path.join(directory, entry["file"]), dtype, tuple(entry["shape"])))
        )
    return out


def write_version(directory: str, version: int) -> None:
    tmp = os.path.join(directory, f".{VERSION}.tmp")
    with open(tmp, "w") as f:
        f.write(str(int(version)))
    os.replace(tmp, os.path.join(directory, VERSION))


def read_version(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, VERSION)) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


class WeightsLock:
    """flock(2) on `<directory>/lock`: exclusive for the writer of the weights, shared for readers.
    Blocking calls: run them in a thread from asyncio code."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, LOCK)
        self._fd: int | None = None
        self.mode: str | None = None

    def _fileno(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd

    def acquire(self, exclusive: bool) -> None:
        """Take the lock (a held lock is converted to the other kind)."""
        fcntl.flock(self._fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        self.mode = "exclusive" if exclusive else "shared"

    def release(self) -> None:
        if self._fd is not None and self.mode is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.mode = None

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        self.acquire(True)
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        self.release()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def remove_run_shares(run_dir: str) -> None:
    """Delete a run's shared weights wherever the trainer put them (its stage is over)."""
    for directory in (shm_dir(run_dir), disk_dir(run_dir)):
        remove_shared(directory)


def remove_shared(directory: str) -> None:
    """Delete the mapped files (the run is over; mappings still open stay valid until unmapped)."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
