"""trainer/colocate.py: the policy shared at its resumed step; each train step runs under the
exclusive weights lock and leaves the step it made as the weights' version."""

from __future__ import annotations

import pathlib
import threading
from typing import Any

import torch
from torch import nn

from services.synchronizer.transfer import shared
from services.trainer.colocate import share_policy


class StubEngine:
    """Pure stand-in for TrainEngine: a model, a step counter, a train_step that bumps both."""

    def __init__(self) -> None:
        self.model = nn.Linear(3, 3)
        self.step = 5
        self.seen_lock: list[bool] = []
        self.probe: shared.WeightsLock | None = None

    def train_step(self, batch: Any) -> dict[str, float]:
        assert self.probe is not None
        blocked = threading.Event()

        def try_read() -> None:  # a reader in another "process" (own open file) must wait now
            import fcntl

            with open(self.probe.path) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    blocked.set()

        t = threading.Thread(target=try_read)
        t.start()
        t.join()
        self.seen_lock.append(blocked.is_set())
        with torch.no_grad():
            self.model.weight.add_(1.0)
        self.step += 1
        return {"loss": 0.0}


def test_train_steps_hold_the_lock_and_write_the_version(tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    directory = tmp_path / "shm"
    monkeypatch.setattr(shared, "shared_dir", lambda run_dir, size: str(directory))
    engine = StubEngine()
    wrapped = share_policy(engine, str(tmp_path))
    assert wrapped.shared_directory == str(directory)
    engine.probe = shared.WeightsLock(str(directory))
    assert shared.read_version(str(directory)) == 5  # the resumed step
    mirror = nn.Linear(3, 3)
    shared.attach_parameters(mirror, str(directory))
    wrapped.train_step(None)
    assert engine.seen_lock == [True]
    assert shared.read_version(str(directory)) == 6
    assert torch.equal(mirror.weight, engine.model.weight)
    wrapped.step = 9  # TrainerLoop moves the step past lost updates: it must reach the engine
    assert engine.step == 9 and wrapped.model is engine.model
