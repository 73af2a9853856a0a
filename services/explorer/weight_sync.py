"""Getting new weights into the engines: from the synchronizer's plan, or from a checkpoint path (bench).

The synchronizer's WeightReceiver fetches a version (checkpoint files or a gloo/nccl broadcast)
into fresh tensors; every engine then copies them in under its lock, converting dtype and device
(a bf16 GPU engine takes the trainer's fp32 weights). vLLM engines go through their own loader.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from services.common.logging import get_logger
from services.explorer.engines.base import EnginePool

log = get_logger("explorer.weights")


class WeightSync(Protocol):
    """What the explorer needs of its weights: ServiceWeightSync, server.NullWeightSync, or a unit test's fake."""

    async def before_step(self, step: int) -> int | None:
        """Ask the synchronizer before `step`; load what it names; return that version (None: keep)."""

    async def load_path(self, version: int, path: str) -> None:
        """Load a checkpoint directory into every engine (bench mode)."""

    async def leave(self) -> None:
        """After the last step's sync: be named in no later weight group."""

    lock: asyncio.Lock  # held while weights change (evaluations take it too)


class EngineWeights:
    """Loads weights into every engine of a pool."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        # Held while weights change; an evaluation holds it too, so it never straddles two versions.
        # Not held while waiting for the synchronizer (that wait may be long).
        self.lock = asyncio.Lock()

    async def load_tensors(self, tensors: dict[str, Any]) -> None:
        async with self.lock:
            for engine in self.pool.engines:
                await engine.update_weights_async(lambda e: e.update_weights(tensors.items()))

    async def leave(self) -> None:
        """No synchronizer to leave (bench mode, tests)."""

    async def load_path(self, version: int, path: str) -> None:
        """bench mode and tests: a checkpoint directory of safetensors files (or its model/ subdir)."""
        async with self.lock:
            for engine in self.pool.engines:
                await engine.update_weights_async(lambda e: e.load_checkpoint(path))
        log.info("checkpoint_loaded", version=version, path=path)


class ServiceWeightSync(EngineWeights):
    """Asks the synchronizer before each step and loads what it names (reports the outcome to it)."""

    def __init__(self, pool: EnginePool, client: Any, receiver: Any) -> None:
        super().__init__(pool)
        self.client = client
        self.receiver = receiver

    async def leave(self) -> None:
        """The last step's weights are loaded: end the heartbeat stream, so the synchronizer names
        this explorer in no later weight group (a trainer would wait for it there until sync_timeout)."""
        await self.client.stop_heartbeat()
        log.info("left_weight_groups", member=getattr(self.client, "member_id", ""))

    async def before_step(self, step: int) -> int | None:
        """Returns the version loaded for this step, or None when the held one stays.

        The receiver fetches the weights (and reports the transfer, failed or not); a failure to
        copy them into the engines afterwards is reported as a failed sync too.
        """
        decision = await self.client.begin_explorer_step(step)
        if decision.load is None:
            return None
        version = decision.load
        tensors = await self.receiver.receive(version, into=None)
        try:
            await self.load_tensors(tensors)
        except Exception as exc:
            await self.client.report_sync(
                version.version, False, f"loading into the engines: {type(exc).__name__}: {exc}"
            )
            raise
        log.info("sync", step=step, version=version.version, reason=decision.reason)
        return int(version.version)
