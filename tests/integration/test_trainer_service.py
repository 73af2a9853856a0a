"""A real trainer process reading a real buffer process: learning, SIGKILL + restart, resume, RPCs.

One scenario (processes are expensive on a 2-core machine):
  run 1: 5 fixed batches in the buffer, save_interval 3 → trains steps 1-5, checkpoint at 3, then
         waits for data; SIGKILL.
  run 2: resumes at step 3; the updates of steps 4 and 5 are not in that checkpoint, so it trains
         their journaled rows again first (replay.py), as steps 4 and 5 (nothing was published),
         reproducing run 1's step-4 loss; then trains the new rows as steps 6-7 and never reads a
         row acked by run 1 from the buffer; GetInfo/SaveCheckpoint answer while it waits; SIGTERM
         makes it exit 0; every row written was trained exactly once (the progress tally).
         (Reaching total_steps and exiting 0 is covered by test_trainer_fsdp.)
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import time

import pytest

from services.buffer.client import BufferClient
from services.common.procs import wait_healthy
from services.trainer.client import TrainerClient
from services.trainer.tally import tally_dir
from tests.fakes.trainer import experience

PAIRS = [("1+2=", "3"), ("2+2=", "4"), ("3+4=", "7"), ("9+9=", "18")]
TOTAL_STEPS = 9


def _batches(first: int, n: int) -> list:
    return [
        experience(p, r, task_id=f"b{b}-{i}")
        for b in range(first, first + n)
        for i, (p, r) in enumerate(PAIRS)
    ]


def _progress(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "trainer" / "progress.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def _wait_for(predicate, timeout: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"trainer exited ({proc.returncode}) before {what}; log: {proc.log_path}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _checkpoints(run_dir: pathlib.Path) -> list[int]:
    root = run_dir / "checkpoints" / "full"
    return sorted(int(p.name.split("_")[-1]) for p in root.glob("global_step_*")) if root.exists() else []


async def test_trainer_learns_resumes_and_replays_the_lost_updates(make_config, service_process) -> None:
    config, data = make_config(
        {
            "mode": "train",
            "name": "trainer-it",
            "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 3e-3}},
            "buffer": {"batch_size": 4, "lease_s": 60},
            "trainer": {
                "total_steps": TOTAL_STEPS,
                "save_interval": 3,
                "micro_batch_size": 2,
                "read_timeout_s": 2,
            },
            "monitor": {"monitor_type": "tensorboard"},
        }
    )
    run_dir = pathlib.Path(data["checkpoint_root_dir"]) / "trinity-grpc" / "trainer-it"
    buffer_addr = f"127.0.0.1:{data['services']['buffer']['port']}"
    trainer_addr = f"127.0.0.1:{data['services']['trainer']['port']}"
    service_process("buffer", config)
    await wait_healthy(buffer_addr, 60)
    async with await BufferClient.connect(buffer_addr) as buffer:
        await buffer.write("experience_buffer", _batches(0, 5))

        # ---- run 1: five steps, then SIGKILL while it waits for more data
        first = service_process("trainer", config)
        await _wait_for(lambda: len(_progress(run_dir)) >= 5, 90, "5 steps", first)
        await _wait_for(lambda: 3 in _checkpoints(run_dir), 10, "checkpoint 3")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        before = _progress(run_dir)
        assert [r["step"] for r in before] == [1, 2, 3, 4, 5]
        losses = [r["metrics"]["actor/loss"] for r in before]
        assert losses[-1] < 0.8 * losses[0], losses  # the same four rows every step: loss goes down
        acked = {key for r in before for key in r["rows"]}

        # ---- run 2: resumes at 3, replays steps 4-5; two batches with the same content but new ids
        await buffer.write("experience_buffer", _batches(5, 2))
        second = service_process("trainer", config)
        await _wait_for(lambda: len(_progress(run_dir)) >= 9, 90, "4 steps after the restart", second)
        after = _progress(run_dir)[5:]
        assert [r["step"] for r in after] == [4, 5, 6, 7]
        assert [r.get("replayed", False) for r in after] == [True, True, False, False]
        assert [r["rows"] for r in after[:2]] == [before[3]["rows"], before[4]["rows"]]
        # the same rows on the same weights (checkpoint 3): the same update as run 1's step 4
        assert after[0]["metrics"]["actor/loss"] == pytest.approx(
            before[3]["metrics"]["actor/loss"], rel=1e-5
        )
        assert after[0]["metrics"]["actor/lr"] == before[3]["metrics"]["actor/lr"]
        assert after[0]["metrics"]["replay/bytes"] > 0

        async with await TrainerClient.connect(trainer_addr) as trainer:
            info = await trainer.get_info()
            assert info.stats["step"] == 7.0 and info.state in ("reading", "waiting_for_data")
            assert info.stats["steps_replayed"] == 2.0 and info.stats["updates_lost"] == 0.0
            path, step = await trainer.save_checkpoint()
            assert step == 7 and path.endswith("global_step_7")
        second.send_signal(signal.SIGTERM)  # graceful: abandons the read, exits 0
        assert second.wait(30) == 0
        assert "trainer_stopping" in pathlib.Path(second.log_path).read_text()

        read_after = [key for r in after[2:] for key in r["rows"]]
        assert not acked & set(read_after)
        assert sorted(read_after) == sorted(f"0/b{b}-{i}/0" for b in range(5, 7) for i in range(4))
        assert _checkpoints(run_dir) == [3, 6, 7]
        assert not list((run_dir / "trainer" / "replay" / "trainer").iterdir())  # all in checkpoint 7
        counted = tally_dir(str(run_dir / "trainer"))
        assert (counted.trained, counted.updates_lost, counted.awaiting_replay) == (7 * 4, 0, 0)
        assert list((run_dir / "monitor" / "tensorboard" / "trainer").glob("events.out.tfevents.*"))


async def test_with_replay_off_a_crash_reports_the_lost_updates(make_config, service_process) -> None:
    """replay_lost_updates false: killed after step 5 with checkpoint 3, the successor goes on from
    the buffer; GetInfo and the progress tally count the 2 lost updates and their 8 rows."""
    config, data = make_config(
        {
            "mode": "train",
            "name": "trainer-noreplay",
            "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 3e-3}},
            "buffer": {"batch_size": 4, "lease_s": 60},
            "trainer": {
                "total_steps": TOTAL_STEPS,
                "save_interval": 3,
                "micro_batch_size": 2,
                "read_timeout_s": 2,
                "replay_lost_updates": False,
            },
        }
    )
    run_dir = pathlib.Path(data["checkpoint_root_dir"]) / "trinity-grpc" / "trainer-noreplay"
    buffer_addr = f"127.0.0.1:{data['services']['buffer']['port']}"
    trainer_addr = f"127.0.0.1:{data['services']['trainer']['port']}"
    service_process("buffer", config)
    await wait_healthy(buffer_addr, 60)
    async with await BufferClient.connect(buffer_addr) as buffer:
        await buffer.write("experience_buffer", _batches(0, 5))
        first = service_process("trainer", config)
        await _wait_for(lambda: len(_progress(run_dir)) >= 5, 90, "5 steps", first)
        first.send_signal(signal.SIGKILL)  # waiting for a 6th batch
        first.wait(10)
        assert not (run_dir / "trainer" / "replay").exists()  # nothing journaled

        await buffer.write("experience_buffer", _batches(5, 1))
        second = service_process("trainer", config)
        await _wait_for(lambda: len(_progress(run_dir)) >= 6, 60, "the 6th batch", second)
        lost = 2  # steps 4 and 5: after checkpoint 3
        async with await TrainerClient.connect(trainer_addr) as trainer:
            info = await trainer.get_info()
            assert info.stats["updates_lost"] == float(lost)
            assert info.stats["rows_update_lost"] == float(4 * lost)
            assert info.stats["steps_replayed"] == 0.0
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    counted = tally_dir(str(run_dir / "trainer"))
    assert (counted.updates_lost, counted.dropped) == (lost, {"update_lost": 4 * lost})
    assert counted.trained + counted.dropped["update_lost"] == 6 * 4  # every row written, once
