"""A trainer told to stop in the middle of a step longer than services.shutdown_grace_s: it abandons
the step before its optimizer step, gives the step's leases back, and exits 0 within the grace.

Real processes: a buffer and a trainer (builtin tiny model, one row per micro-batch, a batch large
enough that a step takes several seconds on 2 cores), SIGTERM while GetInfo says `training`.
"""

from __future__ import annotations

import pathlib
import signal
import time

from services.buffer.client import BufferClient
from services.common.procs import wait_healthy
from services.trainer.client import TrainerClient
from tests.fakes.trainer import experience
from tests.integration.test_trainer_service import _progress

GRACE_S = 1.5
ROWS = 256


async def test_a_stop_abandons_a_long_step_within_the_grace(make_config, service_process) -> None:
    config, data = make_config(
        {
            "mode": "train",
            "name": "trainer-stop",
            "algorithm": {"algorithm_type": "sft"},
            "buffer": {"batch_size": ROWS, "lease_s": 120},
            "trainer": {"total_steps": 5, "micro_batch_size": 1, "read_timeout_s": 2},
            "services": {"shutdown_grace_s": GRACE_S},
        }
    )
    run_dir = pathlib.Path(data["checkpoint_root_dir"]) / "trinity-grpc" / "trainer-stop"
    buffer_addr = f"127.0.0.1:{data['services']['buffer']['port']}"
    trainer_addr = f"127.0.0.1:{data['services']['trainer']['port']}"
    service_process("buffer", config)
    await wait_healthy(buffer_addr, 60)
    rows = [experience("7+8=" * 40, "15" * 20, task_id=f"t{i}") for i in range(ROWS)]
    async with await BufferClient.connect(buffer_addr) as buffer:
        await buffer.write("experience_buffer", rows)
        trainer = service_process("trainer", config)
        await wait_healthy(trainer_addr, 90)
        async with await TrainerClient.connect(trainer_addr) as client:

            async def training() -> bool:
                return (await client.get_info()).state == "training"

            deadline = time.monotonic() + 60
            while not await training():
                assert time.monotonic() < deadline, "the trainer never started its first step"
                assert trainer.poll() is None, f"trainer exited; log {trainer.log_path}"
        sent = time.monotonic()
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(30) == 0
        took = time.monotonic() - sent
        log = pathlib.Path(trainer.log_path).read_text()
        assert "trainer_step_abandoned_at_stop" in log and '"event": "step_abandoned"' in log, log[-3000:]
        # the whole stop (drain, the step given up at its next micro-batch, exit) within the grace
        assert took < GRACE_S + 1.0, f"stop took {took:.2f} s (grace {GRACE_S} s)"
        assert _progress(run_dir) == []  # no step counted, no weights changed, nothing saved
        assert not (run_dir / "checkpoints" / "full").exists()
        # the step's rows are back in the buffer, none acked: another reader gets every one
        stats = await buffer.stats("experience_buffer")
        assert (stats.depth, stats.leased) == (ROWS, 0), stats
