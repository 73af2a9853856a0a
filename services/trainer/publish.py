"""The trainer's side of the sync plan: tell the synchronizer about steps, publish versions when due.

The synchronizer decides (its plan: sync_interval, sync_offset, sync_style, requests of explorers);
this module only asks and obeys. Versions are monotone in the synchronizer's ledger: a trainer that
resumes from a checkpoint older than the last published version numbers its next step after that
version (TrainerLoop._skip_published_steps), and a step at or below it is never published.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from services.common import errors
from services.common.config.schema import TrinityConfig
from services.common.logging import get_logger

log = get_logger("trainer.publish")


class SynchronizerSink:
    """WeightSink over SynchronizerClient + WeightPublisher (see services.synchronizer.client)."""

    def __init__(self, client: Any, publisher: Any, latest_version: int = 0) -> None:
        self.client = client
        self.publisher = publisher
        self.latest_version = latest_version

    async def begin_step(self, step: int) -> None:
        await self.client.begin_trainer_step(step)

    async def end_step(self, step: int, engine: Any) -> bool:
        if not await self.client.end_trainer_step(step):
            return False
        if step <= self.latest_version:
            log.warning(
                "publish_skipped",
                step=step,
                latest_version=self.latest_version,
                reason="a newer version was published before this trainer restarted",
            )
            return False
        t0 = time.perf_counter()
        await self._publish(step, engine)
        log.info("version_published", version=step, seconds=round(time.perf_counter() - t0, 3))
        return True

    async def _publish(self, step: int, engine: Any) -> None:
        if self.publisher.colocated:  # mode colocate: the explorer maps these very parameters
            await self.publisher.publish_in_place(step, engine.shared_directory)
            self.latest_version = step
            return
        state = await asyncio.to_thread(engine.full_model_state)  # a collective under FSDP
        model = engine.model
        config = model.config.to_dict() if hasattr(model, "config") else None
        await self.publisher.publish(state, step, config=config)
        self.latest_version = step

    async def publish_resumed(self, step: int, engine: Any) -> bool:
        """Publish the resumed weights as version `step` when the ledger has no version that new.

        A synchronizer that started without its ledger file (services/synchronizer/store.py) knows
        no version, and explorers resuming at step `step + 1` wait for version `step`, which the plan
        would only publish after data they have not made yet. The checkpoint's weights are that
        version, so they are published once, at start.
        """
        if step <= self.latest_version:
            return False
        await self._publish(step, engine)
        log.info("resumed_version_published", version=step)
        return True

    async def close(self) -> None:
        await self.client.close()


async def connect_sink(cfg: TrinityConfig) -> SynchronizerSink:
    """Connect, register as the trainer (waiting out a dead predecessor's liveness window), beat."""
    from services.synchronizer.client import SynchronizerClient
    from services.synchronizer.weights import WeightPublisher

    client = await SynchronizerClient.connect(cfg.services.synchronizer.address, services_cfg=cfg.services)
    deadline = (
        time.monotonic() + cfg.synchronizer.member_timeout_s + 2 * cfg.synchronizer.heartbeat_interval_s
    )
    while True:
        try:
            reg = await client.register(cfg.trainer.name, "trainer")
            break
        except errors.AlreadyExists:
            # A SIGKILLed predecessor stays "alive" until its heartbeats are missed for member_timeout_s.
            if time.monotonic() > deadline:
                await client.close()
                raise
            await asyncio.sleep(cfg.synchronizer.heartbeat_interval_s / 2)
    client.start_heartbeat()
    log.info(
        "registered",
        member=cfg.trainer.name,
        latest_version=reg.current_version.version,
        last_step=reg.last_step,
    )
    return SynchronizerSink(client, WeightPublisher(client, cfg), latest_version=reg.current_version.version)
