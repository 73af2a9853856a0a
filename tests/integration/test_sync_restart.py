"""A synchronizer SIGKILLed and restarted under members that keep running.

The synchronizer is a real process (`python -m services.synchronizer`), killed with SIGKILL and
started again with the same config; the trainer and the explorer are members in this process
(SynchronizerClient + WeightPublisher / WeightReceiver, checkpoint sync) that are never restarted.
Checked: the acknowledged versions and their manifests come back from
`<run dir>/synchronizer/ledger.json`, the members are still known, the explorer loads the version
the plan names, the trainer's next publish succeeds, and with the ledger file gone (a synchronizer
without persistent storage) the members register again on their own.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal

import pytest

from services.common import errors
from services.common.config import load_config
from services.common.procs import free_port, wait_healthy
from services.synchronizer.client import SynchronizerClient
from services.synchronizer.store import ledger_path
from services.synchronizer.weights import WeightPublisher, WeightReceiver
from tests.integration.sync_member import same_bits, weights
from tests.integration.sync_processes import write_config


async def restart(service_process, config: pathlib.Path, port: int, proc=None):  # type: ignore[no-untyped-def]
    """SIGKILL `proc` (when given), then start the synchronizer again and wait until it serves."""
    if proc is not None:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    proc = service_process("synchronizer", config)
    await wait_healthy(f"127.0.0.1:{port}", 30, alive=lambda: proc.poll() is None)
    return proc


async def trainer_step(trainer: SynchronizerClient, publisher: WeightPublisher, step: int):  # type: ignore[no-untyped-def]
    await trainer.begin_trainer_step(step)
    assert await trainer.end_trainer_step(step)  # sync_interval 1: every step publishes
    return await publisher.publish(weights(step), step, config={"version": step})


async def test_sigkilled_synchronizer_keeps_acknowledged_versions_and_members_carry_on(
    tmp_path: pathlib.Path, service_process
) -> None:
    port = free_port()
    config = write_config(tmp_path, port, sync_method="checkpoint", sync_interval=1, sync_timeout=10)
    cfg = load_config(str(config))
    address = f"127.0.0.1:{port}"
    proc = await restart(service_process, config, port)
    trainer = await SynchronizerClient.connect(address, services_cfg=cfg.services)
    explorer = await SynchronizerClient.connect(address, services_cfg=cfg.services)
    observer = await SynchronizerClient.connect(address, services_cfg=cfg.services)
    try:
        await trainer.register("trainer", "trainer")
        await explorer.register("explorer-a", "explorer")
        trainer.start_heartbeat()
        explorer.start_heartbeat()
        publisher = WeightPublisher(trainer, cfg, master_address="127.0.0.1")
        receiver = WeightReceiver(explorer, cfg)
        state = weights(0)
        assert await receiver.before_step(1, into=state) == 0  # step 1 runs on the base model
        explorer.step = 1
        published = {step: await trainer_step(trainer, publisher, step) for step in (1, 2)}

        proc = await restart(service_process, config, port, proc)

        # the acknowledged version 2 is back, with its checkpoint and manifest
        status = await observer.get_status()
        assert (status.latest_version.version, status.latest_version.checkpoint_path) == (
            2,
            published[2].checkpoint_path,
        )
        assert (await observer.wait_for_version(2, timeout=5)).files == published[2].files
        assert (await observer.get_info()).info.stats["latest_version"] == 2
        # ... and so are the members, at their steps, without registering again
        # (a completed step rides on heartbeats, which are not written: the explorer's may lag by one)
        steps = {m.member_id: m.step for m in status.members}
        assert steps["trainer"] == 2 and steps["explorer-a"] in (0, 1) and len(steps) == 2
        # the explorer, before step 2 (fixed plan: needs version >= 1), is told to load version 2
        decision = await explorer.begin_explorer_step(2)
        assert decision.load is not None and decision.load.version == 2
        assert decision.load.files == published[2].files
        await receiver.receive(decision.load, into=state)
        assert explorer.held == 2 and same_bits(state, weights(2))
        explorer.step = 2
        # the trainer, same process, same client: its next publish succeeds
        assert (await trainer_step(trainer, publisher, 3)).version == 3
        assert await receiver.before_step(3, into=state) == 2  # it holds what step 3 needs
        explorer.step = 3
        assert await receiver.before_step(4, into=state) == 3 and same_bits(state, weights(3))
        explorer.step = 4
        assert trainer._registrations == explorer._registrations == 1  # nobody registered again

        # a synchronizer without its ledger file (no persistent storage): members register again,
        # the explorer from its refused heartbeat stream, the trainer (not beating) from its next call
        await trainer.stop_heartbeat()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        os.remove(ledger_path(cfg.run_dir))
        proc = await restart(service_process, config, port)
        for _ in range(100):
            if [m.member_id for m in (await observer.get_status()).members] == ["explorer-a"]:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the explorer's heartbeat did not register it again")
        assert (await trainer_step(trainer, publisher, 4)).version == 4
        trainer.start_heartbeat()
        assert await receiver.before_step(5, into=state) == 4 and same_bits(state, weights(4))
        assert trainer._registrations == explorer._registrations == 2  # once each, however many calls failed
        status = await observer.get_status()
        assert {m.member_id: m.alive for m in status.members} == {"trainer": True, "explorer-a": True}
        assert status.latest_version.version == 4
    finally:
        for client in (trainer, explorer, observer):
            await client.close()


async def test_a_weight_group_in_flight_is_gone_after_a_restart_and_the_next_sync_rebuilds_it(
    tmp_path: pathlib.Path, service_process
) -> None:
    from services.synchronizer.transfer.broadcast import manifest_of

    port = free_port()
    config = write_config(tmp_path, port, sync_method="nccl", sync_interval=1, sync_timeout=10)
    cfg = load_config(str(config))
    address = f"127.0.0.1:{port}"
    proc = await restart(service_process, config, port)
    trainer = await SynchronizerClient.connect(address, services_cfg=cfg.services)
    explorer = await SynchronizerClient.connect(address, services_cfg=cfg.services)
    try:
        await trainer.register("trainer", "trainer")
        await explorer.register("explorer-a", "explorer")
        assert (await explorer.begin_explorer_step(1)).load is None
        explorer.step = 1
        await trainer.begin_trainer_step(1)
        assert await trainer.end_trainer_step(1)
        tensors = manifest_of(weights(1))
        version, receivers = await trainer.publish_version(1, tensors=tensors)
        assert receivers == ["explorer-a"]  # a group is forming: nobody joined it yet

        proc = await restart(service_process, config, port, proc)

        # version 1 and its tensor list survived; its group did not: joining it fails loudly
        with pytest.raises(errors.FailedPrecondition, match="no weight group for version 1"):
            await trainer.join_weight_group(1, "127.0.0.1", free_port(), "gloo")
        await trainer.report_sync(1, False, "group gone with the synchronizer")  # as WeightPublisher does
        # the explorer runs on with what it holds and asks for a re-publish ...
        decision = await explorer.begin_explorer_step(2)
        assert decision.load is None and "asked for a re-publish" in decision.reason
        # ... which the trainer makes after its next step, in a new group
        await trainer.begin_trainer_step(2)
        assert await trainer.end_trainer_step(2)
        version, receivers = await trainer.publish_version(2, tensors=tensors)
        assert version.version == 2 and version.tensors == tensors and receivers == ["explorer-a"]
        status = await trainer.get_status()
        assert [(g.version, g.state, list(g.members)) for g in status.groups] == [
            (2, "forming", ["trainer", "explorer-a"])
        ]
    finally:
        for client in (trainer, explorer):
            await client.close()
