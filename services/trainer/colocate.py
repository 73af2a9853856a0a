"""The trainer's side of mode colocate: its policy's parameters are the engine's (shared.py).

`share_policy` shares the policy's parameters once the engine is built (and resumed), under the
weights lock: on CPU it moves them into the run's shared files, on a GPU it writes their CUDA IPC
records (cuda_share.py). `InPlaceEngine` wraps the engine so that every train step
holds the lock exclusively and records the version the weights then hold; the sink publishes
versions without gathering or sending any tensor (WeightPublisher with `in_place`).
"""

from __future__ import annotations

from typing import Any

from services.common.logging import get_logger
from services.synchronizer.transfer import cuda_share, shared

log = get_logger("trainer.colocate")


class InPlaceEngine:
    """The engine, with train_step run under the exclusive weights lock; everything else passes through."""

    def __init__(self, engine: Any, directory: str, lock: shared.WeightsLock) -> None:
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_directory", directory)
        object.__setattr__(self, "_lock", lock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._engine, name, value)  # e.g. TrainerLoop moving `step` past lost updates

    @property
    def shared_directory(self) -> str:
        """Where the weights are shared (the publisher names it with each version)."""
        return str(self._directory)

    def train_step(self, batch: Any) -> dict[str, float]:
        with self._lock.exclusive():
            metrics: dict[str, float] = self._engine.train_step(batch)
            cuda_share.settle()  # on a GPU: the optimizer's kernels have written the weights
            shared.write_version(self._directory, self._engine.step)
        return metrics


def share_policy(engine: Any, run_dir: str) -> InPlaceEngine:
    """Share the built engine's policy (blocking: run it in a thread) and wrap the engine."""
    params = list(engine.model.parameters())
    on_host = all(p.device.type == "cpu" for p in params)  # on a GPU nothing goes into the files
    size = sum(p.numel() * p.element_size() for p in params) if on_host else 0
    directory = shared.shared_dir(run_dir, size)
    lock = shared.WeightsLock(directory)
    with lock.exclusive():  # an explorer attached before a restart may be generating from them
        size = shared.share_parameters(engine.model, directory, engine.step)  # tied: counted once
    device = str(params[0].device) if params else "cpu"
    log.info(
        "weights_shared", directory=directory, mib=round(size / 2**20, 1), version=engine.step, device=device
    )
    return InPlaceEngine(engine, directory, lock)
