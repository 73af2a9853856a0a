"""transfer/shared.py: the trainer's parameters moved into mapped files, another module mapping them
(one copy: an in-place update on one side is the other's), the manifest's checks, the weights lock."""

from __future__ import annotations

import os
import pathlib
import threading
import time

import pytest
import torch
from torch import nn

from services.common.errors import FailedPrecondition
from services.synchronizer.transfer import shared


class Tied(nn.Module):
    """Embedding and head share one parameter, as SmolLM2's do."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(11, 4)
        self.mid = nn.Linear(4, 4)
        self.head = nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight


def test_attached_parameters_are_the_trainers_memory(tmp_path: pathlib.Path) -> None:
    trainer, engine = Tied(0), Tied(1)
    before = {k: v.clone() for k, v in trainer.state_dict().items()}
    size = shared.share_parameters(trainer, str(tmp_path), version=3)
    assert size == (11 * 4 + 4 * 4 + 4) * 4  # the tied matrix once
    assert all(torch.equal(before[k], v) for k, v in trainer.state_dict().items())  # values kept
    assert shared.attach_parameters(engine, str(tmp_path)) == size
    assert all(torch.equal(v, trainer.state_dict()[k]) for k, v in engine.state_dict().items())
    with torch.no_grad():  # the optimizer's in-place update is the engine's weights
        trainer.mid.weight.add_(1.0)
        trainer.embed.weight.mul_(2.0)
    assert torch.equal(engine.mid.weight, trainer.mid.weight)
    assert torch.equal(engine.head.weight, trainer.embed.weight)  # through the tie on both sides
    assert shared.read_version(str(tmp_path)) == 3
    shared.write_version(str(tmp_path), 4)
    assert shared.read_version(str(tmp_path)) == 4


def test_a_restarted_trainer_overwrites_the_files_an_engine_already_maps(tmp_path: pathlib.Path) -> None:
    shared.share_parameters(Tied(0), str(tmp_path), version=1)
    engine = Tied(1)
    shared.attach_parameters(engine, str(tmp_path))
    resumed = Tied(2)
    shared.share_parameters(resumed, str(tmp_path), version=1)
    assert torch.equal(engine.mid.weight, Tied(2).mid.weight)


def test_attach_refuses_what_does_not_match(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FailedPrecondition, match="no shared weights"):
        shared.attach_parameters(Tied(0), str(tmp_path))
    shared.share_parameters(Tied(0), str(tmp_path), version=0)
    other = Tied(1)
    other.mid = nn.Linear(4, 5)
    with pytest.raises(FailedPrecondition, match=r"mid\.weight has shape \[4, 4\]"):
        shared.attach_parameters(other, str(tmp_path))
    extra = Tied(1)
    extra.more = nn.Linear(2, 2)
    with pytest.raises(FailedPrecondition, match=r"no parameter more\.weight"):
        shared.attach_parameters(extra, str(tmp_path))


def test_the_engine_is_cast_to_the_shared_dtype(tmp_path: pathlib.Path) -> None:
    shared.share_parameters(Tied(0), str(tmp_path), version=0)
    engine = Tied(1).to(torch.bfloat16)
    shared.attach_parameters(engine, str(tmp_path))
    assert {p.dtype for p in engine.parameters()} == {torch.float32}


def test_the_exclusive_lock_waits_for_shared_holders_and_holds_them_off(tmp_path: pathlib.Path) -> None:
    reader, writer = shared.WeightsLock(str(tmp_path)), shared.WeightsLock(str(tmp_path))
    reader.acquire(False)
    got = threading.Event()

    def write() -> None:
        with writer.exclusive():
            got.set()
            time.sleep(0.2)

    thread = threading.Thread(target=write)
    thread.start()
    assert not got.wait(0.2)  # the reader holds it
    reader.release()
    assert got.wait(5)
    t0 = time.monotonic()
    reader.acquire(False)  # waits for the writer's update to end
    assert time.monotonic() - t0 > 0.1
    thread.join()
    reader.close()
    writer.close()


def test_remove_shared_deletes_the_directory(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "w"
    shared.share_parameters(Tied(0), str(directory), version=0)
    shared.WeightsLock(str(directory)).close()
    shared.remove_shared(str(directory))
    assert not directory.exists()
    shared.remove_shared(str(directory))  # gone already: fine


def test_shared_dir_is_per_run_dir_and_falls_back_to_disk_when_shm_is_short(tmp_path: pathlib.Path) -> None:
    a, b = shared.shm_dir(str(tmp_path / "a")), shared.shm_dir(str(tmp_path / "b"))
    assert a != b and a == shared.shm_dir(os.path.relpath(tmp_path / "a"))
    assert shared.shared_dir(str(tmp_path / "a"), 1024) == a  # /dev/shm has room for 1 KiB
    huge = 1 << 60
    assert shared.shared_dir(str(tmp_path / "a"), huge) == str(tmp_path / "a" / "shared_weights")
