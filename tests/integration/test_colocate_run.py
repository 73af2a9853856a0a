"""`trinity run` in mode colocate on the builtin tiny model: the trainer moves its policy's parameters
into shared memory, the explorer's engine maps them (services/synchronizer/transfer/shared.py), and
no weight is ever copied between them, yet every step samples from the weights the trainer just
made: with a learning rate large enough to move the logprobs far between steps, the trainer's
logprobs of each batch equal the engine's (ppo_kl ~ 0) and every row's version is the step before
the one that trained it. The shared files are gone when the run ends."""

from __future__ import annotations

import json
import pathlib

import pytest

from services.synchronizer.transfer.shared import disk_dir, shm_dir
from tests.integration.drills import run_with_trainer_killed
from tests.integration.runs import stages, trinity_run, write_run_config
from tests.integration.test_fully_async_run import async_config

pytestmark = pytest.mark.slow
STEPS = 3


def lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(log: pathlib.Path, name: str) -> list[dict]:
    out = []
    for line in log.read_text().splitlines():
        if f'"{name}"' in line and line.startswith("{"):
            out.append(json.loads(line))
    return out


@pytest.mark.timeout(600)
def test_colocate_run_samples_every_step_from_the_trainers_own_parameters(tmp_path: pathlib.Path) -> None:
    cfg = async_config(tmp_path, STEPS, 16)
    cfg["mode"] = "colocate"
    # the untrained tiny model scores 0 everywhere (flat groups); an entropy bonus moves the weights
    # anyway, and a large learning rate moves the policy's logprobs far at every step
    cfg["algorithm"].update(entropy_loss_fn="default", entropy_loss_fn_args={"entropy_coef": 0.5})
    cfg["algorithm"]["optimizer"]["lr"] = 3e-2
    cfg["explorer"]["replicas"] = 1
    cfg["synchronizer"] = {"sync_method": "memory", "sync_interval": 1}  # Trinity's colocate spelling
    out = trinity_run(write_run_config(cfg, tmp_path / "config.yaml"))
    run_dir = tmp_path / "runs" / "fa" / "run"
    summary = stages(run_dir)[0]
    assert summary["status"] == "complete" and summary["steps"] == STEPS, out[-2000:]
    memory = summary["memory"]  # all services at once (cli/memory_watch.py)
    assert set(memory["at_peak"]) == {"buffer", "synchronizer", "trainer", "explorer"}, memory
    assert memory["samples"] > 1 and memory["peak_total_rss_mb"] == pytest.approx(
        sum(memory["at_peak"].values()), abs=1
    )
    assert "all services at once, peak" in out

    logs = run_dir / "logs"
    shared = events(logs / "trainer.log", "weights_shared")
    attached = events(logs / "explorer.log", "weights_attached")
    assert len(shared) == 1 and len(attached) == 1  # once each: later versions move nothing
    assert shared[0]["directory"] == attached[0]["directory"]
    assert shared[0]["directory"] in (shm_dir(str(run_dir)), disk_dir(str(run_dir)))
    assert attached[0]["mib"] == shared[0]["mib"] > 0
    assert not events(logs / "explorer.log", "checkpoint_loaded")

    trained = lines(run_dir / "trainer" / "progress.jsonl")
    assert [record["step"] for record in trained] == list(range(1, STEPS + 1))
    kls = [record["metrics"]["actor/ppo_kl"] for record in trained]
    assert all(abs(kl) < 1e-4 for kl in kls), kls
    moved = [record["metrics"]["actor/grad_norm"] for record in trained]
    assert all(norm > 0.01 for norm in moved), moved  # every step did update the shared weights
    for record in trained:  # on-policy: step s trains rows of version s - 1
        assert record["metrics"]["staleness/max"] == 0, record["metrics"]
    assert not pathlib.Path(shared[0]["directory"]).exists()


@pytest.mark.timeout(600)
def test_a_trainer_killed_in_a_colocate_run_shares_its_checkpoint_again(tmp_path: pathlib.Path) -> None:
    """SIGKILL the trainer a step or more past its checkpoint: the restarted trainer copies the
    checkpoint's weights into the files the explorer still maps (no second attach), replays what
    was lost (trainer.replay_lost_updates), and the run ends with every row counted."""
    cfg = async_config(tmp_path, 12, 200)
    cfg["mode"] = "colocate"
    cfg["explorer"]["replicas"] = 1
    cfg["synchronizer"] = {"sync_interval": 1}
    cfg["trainer"] = {"save_interval": 4}
    config = write_run_config(cfg, tmp_path / "config.yaml")
    run_dir = tmp_path / "runs" / "fa" / "run"
    out = run_with_trainer_killed(config, run_dir, 4, 5, tmp_path / "run.log")
    assert "trainer exited with code -9; restarting it" in out
    logs = run_dir / "logs"
    shared = events(logs / "trainer.log", "weights_shared")
    assert len(shared) == 2 and shared[0]["directory"] == shared[1]["directory"]
    assert shared[1]["version"] % 4 == 0  # the checkpoint's weights, shared again
    assert len(events(logs / "explorer.log", "weights_attached")) == 1
    summary = stages(run_dir)[0]
    assert summary["status"] == "complete" and summary["steps"] == 12 and summary["updates_lost"] == 0
    counts = summary["experiences"]
    assert counts["written"] == counts["trained"] + counts["buffered"] + sum(counts["dropped"].values())
    trained = lines(run_dir / "trainer" / "progress.jsonl")
    # the replayed step shifts the turns by one: from then on rows are one version old, never more
    assert max(record["metrics"]["staleness/max"] for record in trained) <= 1
