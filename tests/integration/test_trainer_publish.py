"""A real trainer publishes versions to a real synchronizer per the sync plan (sync_method checkpoint)."""

from __future__ import annotations

import pathlib

import torch

from services.buffer.client import BufferClient
from services.common.procs import wait_healthy
from services.models.loading import load_causal_lm
from services.synchronizer.client import SynchronizerClient
from services.synchronizer.transfer.checkpoint import load_checkpoint
from tests.unit.trainer_fakes import experience


async def test_trainer_publishes_every_sync_interval_and_ends_cleanly(make_config, service_process) -> None:
    config, data = make_config({
        "mode": "both",
        "name": "publish-it",
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2, "optimizer": {"lr": 1e-3}},
        "buffer": {"batch_size": 2},
        "trainer": {"total_steps": 4, "save_interval": 100, "micro_batch_size": 4, "read_timeout_s": 2},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 2},
        "monitor": {"monitor_type": "none"},
    })
    run_dir = pathlib.Path(data["checkpoint_root_dir"]) / "trinity-grpc" / "publish-it"
    ports = {name: data["services"][name]["port"] for name in ("buffer", "synchronizer")}
    service_process("buffer", config)
    service_process("synchronizer", config)
    await wait_healthy(f"127.0.0.1:{ports['buffer']}", 60)
    await wait_healthy(f"127.0.0.1:{ports['synchronizer']}", 60)
    # GRPO groups of 2 with different rewards, behaviour logprobs missing (recomputed by the trainer).
    rows = [experience("1+1=", answer, task_id=f"s{s}-t{t}", batch_id=s, reward=float(answer == "2"))
            for s in range(4) for t in range(2) for answer in ("2", "3")]
    async with await BufferClient.connect(f"127.0.0.1:{ports['buffer']}") as buffer:
        await buffer.write("experience_buffer", rows)
    trainer = service_process("trainer", config)
    assert trainer.wait(120) == 0, pathlib.Path(trainer.log_path).read_text()[-3000:]

    async with await SynchronizerClient.connect(f"127.0.0.1:{ports['synchronizer']}") as sync:
        version = await sync.wait_for_version(4, timeout=10)
    assert version.version == 4
    published = load_checkpoint(version.checkpoint_path, version.files)
    final = load_causal_lm(str(run_dir / "checkpoints" / "full" / "global_step_4" / "model"))
    for name, tensor in final.state_dict().items():
        torch.testing.assert_close(published[name], tensor, rtol=0, atol=0)
    assert (run_dir / "global_step_2").is_dir()  # version 2 was published too (sync_interval 2)
