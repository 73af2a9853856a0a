"""Reading published weights: safetensors checkpoint directories and in-memory state dicts."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

from services.common.errors import NotFound


def iter_checkpoint_tensors(path: str) -> Iterator[tuple[str, Any]]:
    """(name, tensor) for every tensor of every *.safetensors file in `path` (or `path/model`), by file name."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:  # a full trainer checkpoint keeps the HF weights under model/
        files = sorted(glob.glob(os.path.join(path, "model", "*.safetensors")))
    if not files:
        raise NotFound(f"no *.safetensors files in checkpoint {path}", field="checkpoint_path")
    for file in files:
        yield from load_file(file).items()


def copy_into_module(module: Any, named_tensors: Iterable[tuple[str, Any]]) -> int:
    """Copy tensors into the module's parameters and buffers in place; returns how many were copied.

    In place (param.data.copy_) so tied weights stay tied and the KV-cache code keeps its
    references. Names may carry a leading "module." or "_orig_mod." (DDP / torch.compile).
    Unknown names are an error: silently ignoring them would leave the old weights in use.
    """
    import torch

    targets = dict(module.named_parameters(remove_duplicate=False))
    targets.update(dict(module.named_buffers(remove_duplicate=False)))
    copied = 0
    with torch.no_grad():
        for name, tensor in named_tensors:
            key = name
            for prefix in ("module.", "_orig_mod."):
                if key.startswith(prefix):
                    key = key[len(prefix) :]
            if key not in targets:
                raise NotFound(f"weight {name!r} does not exist in the rollout model", field="weights")
            target = targets[key]
            target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))
            copied += 1
    return copied


_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def list_step_dirs(*roots: str) -> list[tuple[int, str]]:
    """(step, path) of every global_step_N directory directly under the roots, oldest first (bench mode)."""
    found: dict[int, str] = {}
    for root in roots:
        if not os.path.isdir(root):
            continue
        for entry in os.listdir(root):
            match = _STEP_DIR.match(entry)
            if match and os.path.isdir(os.path.join(root, entry)):
                found.setdefault(int(match.group(1)), os.path.join(root, entry))
    return sorted(found.items())
