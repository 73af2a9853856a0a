"""The sharded path: the trainer service under torchrun, 2 CPU processes on gloo, FSDP2.

Rank 0 serves, reads a real buffer and publishes to a real synchronizer; rank 1 follows. GRPO with
a reference model and behaviour logprobs recomputed by the trainer. With 3 rows and micro-batches
of 1, rank 0 gets two micro-batches and rank 1 one plus a zero-weight dummy. The losses, grad
norms, the published version 2 and the final checkpoint must match a one-process engine trained on
the same batches — including a fourth step run by a second torchrun that resumes the sharded
optimizer state from the step-3 checkpoint. With trainer.ulysses_sequence_parallel_size 2 the two
ranks form one sequence-parallel group instead: both run every micro-batch, each on half of the
positions (services/trainer/ulysses.py), and the same numbers must come out.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import yaml

from services.buffer.client import BufferClient
from services.common.config.loader import load_config
from services.common.procs import free_port, stop_process, wait_healthy
from services.models.loading import load_causal_lm
from services.synchronizer.client import SynchronizerClient
from services.synchronizer.transfer.checkpoint import load_checkpoint
from services.trainer.batching import build_batch
from services.trainer.build import build_engine
from tests.fakes.trainer import experience

ROWS = [("1+2=", "3", "a", 1.0), ("1+2=", "4", "a", 0.0), ("7+7=", "14", "b", 1.0)]  # GRPO groups a, b
STEPS = 3


async def buffer_write(address: str, rows: list) -> None:
    async with await BufferClient.connect(address) as buffer:
        await buffer.write("experience_buffer", rows)


def _torchrun(config: pathlib.Path, log_path: pathlib.Path) -> int:
    """`torchrun --nproc_per_node 2 -m services.trainer --config F` until it exits; its exit code."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "services.trainer",
        "--config",
        str(config),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(180)
    finally:
        stop_process(proc, timeout=10)
    assert rc == 0, log_path.read_text()[-4000:]
    return rc


@pytest.mark.slow  # two torchrun launches of two ranks each: ~35 s on an idle 2-core machine
@pytest.mark.parametrize("ulysses", [1, 2])
async def test_fsdp2_on_two_cpu_ranks_matches_one_process(
    make_config, service_process, tmp_path, ulysses: int
) -> None:
    config, data = make_config(
        {
            "mode": "both",
            "name": "fsdp-it",
            "algorithm": {"algorithm_type": "grpo", "optimizer": {"lr": 1e-3}},
            "synchronizer": {"sync_method": "checkpoint", "sync_interval": 2},
            "buffer": {"batch_size": 3, "train_batch_size": 3},  # the 3 rows of ROWS a step
            "trainer": {
                "total_steps": STEPS,
                "save_interval": 100,
                "micro_batch_size": 1,
                "strategy": "fsdp2",
                "ulysses_sequence_parallel_size": ulysses,
                "read_timeout_s": 2,
            },
            "monitor": {"monitor_type": "none"},
        }
    )
    run_dir = pathlib.Path(data["checkpoint_root_dir"]) / "trinity-grpc" / "fsdp-it"
    buffer_addr = f"127.0.0.1:{data['services']['buffer']['port']}"
    sync_addr = f"127.0.0.1:{data['services']['synchronizer']['port']}"
    service_process("buffer", config)
    service_process("synchronizer", config)
    await wait_healthy(buffer_addr, 60)
    await wait_healthy(sync_addr, 60)
    rows = [
        experience(p, r, task_id=f"s{s}-{task}", reward=reward)
        for s in range(STEPS)
        for p, r, task, reward in ROWS
    ]
    await buffer_write(buffer_addr, rows)

    assert _torchrun(config, tmp_path / "torchrun-1.log") == 0
    # each rank says whether it split the sequences (dp_size: data-parallel groups of the 2 ranks)
    split = len(re.findall(r'"event":\s*"sequence_parallel"', (tmp_path / "torchrun-1.log").read_text()))
    assert split == (2 if ulysses == 2 else 0)

    # Resume under FSDP2 (optimizer state scattered back to the shards) for one more step, train-only.
    await buffer_write(
        buffer_addr,
        [experience(p, r, task_id=f"s{STEPS}-{task}", reward=reward) for p, r, task, reward in ROWS],
    )
    resume_config = tmp_path / "resume.yaml"
    resume_config.write_text(
        yaml.safe_dump({**data, "mode": "train", "trainer": {**data["trainer"], "total_steps": STEPS + 1}})
    )
    assert _torchrun(resume_config, tmp_path / "torchrun-2.log") == 0
    rows += [experience(p, r, task_id=f"s{STEPS}-{task}", reward=reward) for p, r, task, reward in ROWS]

    # The same batches through a one-process engine.
    sharded_cfg = load_config(str(config))
    cfg = sharded_cfg.model_copy(
        update={
            "trainer": sharded_cfg.trainer.model_copy(
                update={"strategy": "single", "ulysses_sequence_parallel_size": 1}
            ),
            "checkpoint_root_dir": str(tmp_path / "single"),
        }
    )
    engine = build_engine(cfg, device="cpu").engine
    expected, at_step_2 = [], {}
    for s in range(STEPS + 1):
        expected.append(engine.train_step(build_batch(rows[3 * s : 3 * s + 3], pad_token_id=0)))
        if s == 1:
            at_step_2 = {k: v.clone() for k, v in engine.model.state_dict().items()}
    got = [
        json.loads(x)["metrics"] for x in (run_dir / "trainer" / "progress.jsonl").read_text().splitlines()
    ]
    # AdamW is blind to a constant gradient factor; the pre-clip grad norm is not, so check both.
    for key in ("actor/loss", "actor/grad_norm"):
        assert [m[key] for m in got] == pytest.approx([m[key] for m in expected], rel=1e-5, abs=1e-7), key

    async with await SynchronizerClient.connect(sync_addr) as sync:
        version = await sync.wait_for_version(2, timeout=10)
    assert version.version == 2  # sync_interval 2: step 2 published, step 3 not
    published = load_checkpoint(version.checkpoint_path, version.files)
    for name, tensor in at_step_2.items():
        torch.testing.assert_close(published[name], tensor, rtol=1e-4, atol=1e-4, msg=name)

    sharded = load_causal_lm(
        str(run_dir / "checkpoints" / "full" / f"global_step_{STEPS + 1}" / "model")
    ).state_dict()
    for name, tensor in engine.model.state_dict().items():
        # atol: AdamW's first steps move near-zero gradients by ~lr * sign, which float noise can flip.
        torch.testing.assert_close(sharded[name], tensor, rtol=1e-4, atol=1e-4, msg=name)
