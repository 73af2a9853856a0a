"""Full checkpoints: weights (HF format), optimizer, scheduler, step, data cursor, RNG.

Layout: `<run_dir>/checkpoints/full/global_step_N/` holding
  model/               save_pretrained weights + tokenizer (loadable as a model_path, e.g. by the next stage);
                       with LoRA the merged weights (base + adapter), a plain model
  lora_adapter/        with LoRA only: the adapter, peft's save_pretrained (what a resume trains on)
  engine.pt            optimizer, scheduler, critic, step (torch.save)
  trainer_state.json   step, data cursor, time (human-readable; written last)
A checkpoint is written under a hidden temporary name and renamed into place, so a directory named
global_step_N is always complete: a crash mid-save leaves only a temp dir, which the next save removes.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from services.trainer import lora

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_TMP_PREFIX = ".tmp-global_step_"


@dataclass
class DataCursor:
    """How much data the run has consumed (and acked), so a resumed run reports where it stands.

    The buffer deletes acked rows, so the cursor is not needed to skip them; it is kept so that a
    resumed run knows its totals and so auxiliary/table readers can be told where to continue.
    """

    batches: int = 0
    samples: int = 0
    tokens: int = 0
    per_buffer: dict[str, int] = field(default_factory=dict)


@dataclass
class TrainerState:
    step: int
    model_version: int
    cursor: DataCursor
    saved_at: float = 0.0


def full_checkpoint_root(run_dir: str | os.PathLike[str]) -> pathlib.Path:
    return pathlib.Path(run_dir) / "checkpoints" / "full"


def list_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, pathlib.Path]]:
    """Complete checkpoints under `root` as (step, path), oldest first."""
    root = pathlib.Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and (entry / "trainer_state.json").is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike[str]) -> tuple[int, pathlib.Path] | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def save_checkpoint(
    root: str | os.PathLike[str],
    state: TrainerState,
    *,
    model: Any,
    tokenizer: Any,
    engine_state: dict[str, Any],
    model_state: dict[str, Any] | None = None,
    keep: int | None = None,
) -> pathlib.Path:
    """Write global_step_<state.step> atomically; prune to the newest `keep`. Returns its path.

    model_state: the full weights when `model` is sharded (FSDP); None saves `model`'s own (with
    LoRA, merged). A peft-wrapped `model` also writes its adapter to lora_adapter/.
    """
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{state.step}"
    if (final / "trainer_state.json").is_file():
        return final  # this step is saved already (interval save + SaveCheckpoint RPC)
    for stale in root.glob(f"{_TMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f"{_TMP_PREFIX}{state.step}-{os.getpid()}"
    (tmp / "model").mkdir(parents=True)
    if lora.is_lora(model):
        lora.save_adapter(model, tmp / lora.ADAPTER_DIR)
        model_state = model_state if model_state is not None else lora.merged_state_dict(model)
        model = lora.hf_model(model)
    model.save_pretrained(tmp / "model", state_dict=model_state)
    tokenizer.save_pretrained(tmp / "model")
    engine_state = {**engine_state, "rng": _rng_state()}
    torch.save(engine_state, tmp / "engine.pt")
    state.saved_at = time.time()
    with open(tmp / "trainer_state.json", "w") as fh:
        json.dump(asdict(state), fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    if final.exists():  # an incomplete directory of the same name (no trainer_state.json)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    if keep is not None:
        prune(root, keep)
    return final


def load_trainer_state(path: str | os.PathLike[str]) -> TrainerState:
    with open(pathlib.Path(path) / "trainer_state.json") as fh:
        raw = json.load(fh)
    cursor = DataCursor(**raw.pop("cursor"))
    return TrainerState(cursor=cursor, **raw)


def load_engine_state(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """The engine's state dict; restores the RNG state saved with it."""
    state: dict[str, Any] = torch.load(
        pathlib.Path(path) / "engine.pt", map_location=map_location, weights_only=False
    )
    rng = state.pop("rng", None)
    if rng is not None:
        _set_rng_state(rng)
    return state


def model_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    return pathlib.Path(path) / "model"


def latest_model_dir(run_dir: str | os.PathLike[str]) -> pathlib.Path | None:
    """HF-format weights of a run's newest full checkpoint (the model_path of a next stage), if any."""
    latest = latest_checkpoint(full_checkpoint_root(run_dir))
    return model_dir(latest[1]) if latest else None


def prune(root: pathlib.Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints."""
    for _step, path in list_checkpoints(root)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
