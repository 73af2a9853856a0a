"""Mode colocate on a GPU: the trainer's CUDA parameters opened in the explorer's process (CUDA IPC).

On a GPU the trainer's parameters are device memory, so they cannot live in mapped files as they do
on CPU (shared.py). CUDA can hand an allocation to another process instead: torch's
`reduce_tensor` turns a CUDA tensor into a record (a cudaIpcMemHandle of its allocation, the
offset, shape, stride and dtype), and `rebuild_cuda_tensor` in another process opens that record as
a tensor on the same memory. The trainer writes the records of its parameters beside the manifest
(`cuda_ipc-<owner>.pkl`, a pickle of torch's own records); the explorer rebuilds its engine's
parameters from them. From then on the device holds one copy of the policy, which the trainer's
optimizer updates in place, as the mapped files are on CPU.

What differs from the files:
- The memory belongs to the trainer's process. A trainer that restarts allocates new memory and
  writes new records under a new `owner` (in the manifest); the explorer attaches again at the next
  version it loads (services/explorer/colocate.py).
- Both processes must see the same device (one machine, the same CUDA_VISIBLE_DEVICES). CUDA
  refuses to open a handle in the process that exported it, which colocate never asks.
- GPU work is asynchronous: a process must wait for the kernels it queued (`settle`) before it
  lets go of the weights lock, or the other side could read weights still being written.
- The records are unpickled by a loader that admits torch's own classes and functions only.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import uuid
from typing import Any

import torch

PREFIX = "cuda_ipc-"


class _TorchOnly(pickle.Unpickler):
    """Unpickles torch's IPC records and refuses any global from outside torch."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" or module.startswith("torch."):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of torch: not a CUDA IPC record")


def new_owner() -> str:
    """A name for this process's export, new at every trainer start (pid and a random part)."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def export(tensors: list[torch.Tensor], directory: str, owner: str) -> str:
    """Write the IPC records of `tensors` (all CUDA) to `<directory>/cuda_ipc-<owner>.pkl`, in
    their order; returns the file's name. The caller keeps the tensors alive: the records point
    at their memory."""
    from torch.multiprocessing.reductions import reduce_tensor

    records = [reduce_tensor(t.detach()) for t in tensors]
    name = f"{PREFIX}{owner}.pkl"
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(records, f)
    os.replace(tmp, os.path.join(directory, name))
    return name


def open_tensors(directory: str, name: str) -> list[torch.Tensor]:
    """The tensors of an export, opened in this process on the exporter's memory (no copy)."""
    with open(os.path.join(directory, name), "rb") as f:
        records = _TorchOnly(f).load()
    return [rebuild(*args) for rebuild, args in records]


def remove_stale(directory: str, keep: str) -> None:
    """Delete the records of earlier owners (a trainer that died); `keep` is the current file."""
    for entry in os.listdir(directory):
        if entry.startswith(PREFIX) and entry != keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))


def _used_cuda() -> bool:
    """Has this process used CUDA (asking never initialises it)?"""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def settle() -> None:
    """Wait for the GPU work this process queued (nothing where it never used CUDA)."""
    if _used_cuda():
        torch.cuda.synchronize()


def allocated_mib() -> float | None:
    """CUDA memory this process's tensors hold (MiB), None where it never used CUDA."""
    return round(torch.cuda.memory_allocated() / 2**20, 1) if _used_cuda() else None
