"""Getting new weights into the engines: from the synchronizer's plan, or from a checkpoint path (bench).

The synchronizer's WeightReceiver fetches a version (checkpoint files or a gloo/nccl broadcast)
into fresh tensors; every engine then copies them in under its lock, converting dtype and device
(a bf16 GPU engine takes the trainer's fp32 weights). vLLM engines go through their own loader.
Under fully_async a version may also arrive while a step generates (partial rollouts, mid_step.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from services.common import errors
from services.common.logging import get_logger
from services.explorer.engines.base import EnginePool
from services.explorer.mid_step import MidStepWatch, StepLoads, arm_hold, hold_token
from services.synchronizer import plan as P

log = get_logger("explorer.weights")


class WeightSync(Protocol):
    """What the explorer needs of its weights: ServiceWeightSync, server.NullWeightSync, or a unit test's fake."""

    async def before_step(self, step: int) -> int | None:
        """Ask the synchronizer before `step`; load what it names; return that version (None: keep)."""

    async def load_path(self, version: int, path: str) -> None:
        """Load a checkpoint directory into every engine (bench mode)."""

    async def leave(self) -> None:
        """After the last step's sync: be named in no later weight group."""

    def during_step(self, step: int, on_loaded: Callable[[int], None]) -> StepLoads:
        """The window of `step` in which a newer version may load mid-generation (mid_step.py);
        `on_loaded(version)` once it is in the engines."""

    lock: asyncio.Lock  # held while weights change (evaluations take it too)


class EngineWeights:
    """Loads weights into every engine of a pool."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        # Held while weights change; an evaluation holds it too, so it never straddles two versions.
        # Not held while waiting for the synchronizer (that wait may be long).
        self.lock = asyncio.Lock()

    async def load_tensors(self, tensors: dict[str, Any], version: int, *, mid_batch: bool = False) -> None:
        """Into every engine; `mid_batch`: between two tokens of a generating batch (push_weights)."""
        async with self.lock:
            for engine in self.pool.engines:
                if mid_batch:
                    await engine.push_weights_async(version, tensors.items())
                else:
                    await engine.update_weights_async(lambda e: e.update_weights(tensors.items()), version)

    async def leave(self) -> None:
        """No synchronizer to leave (bench mode, tests)."""

    def during_step(self, step: int, on_loaded: Callable[[int], None]) -> StepLoads:
        """No synchronizer: nothing loads mid-step."""
        return StepLoads()

    async def load_path(self, version: int, path: str) -> None:
        """bench mode and tests: a checkpoint directory of safetensors files (or its model/ subdir)."""
        async with self.lock:
            for engine in self.pool.engines:
                await engine.update_weights_async(lambda e: e.load_checkpoint(path), version)
        log.info("checkpoint_loaded", version=version, path=path)


class ServiceWeightSync(EngineWeights):
    """Asks the synchronizer before each step and loads what it names (reports the outcome to it)."""

    def __init__(self, pool: EnginePool, client: Any, receiver: Any, plan: P.Plan | None = None) -> None:
        super().__init__(pool)
        self.client = client
        self.receiver = receiver
        self.plan = plan
        """The synchronizer's plan (from Register); None: no loads mid-step."""
        self.partial = all(engine.can_push_weights for engine in pool.engines)
        self.last_sync_step = 0
        """Steps done when this process last loaded (as the ledger counts it; 0 after a start)."""
        self.left = False
        self.hold = hold_token()  # the integration tests' hook (mid_step.py); None otherwise

    async def leave(self) -> None:
        """The last step's weights are loaded: end the heartbeat stream, so the synchronizer names
        this explorer in no later weight group (a trainer would wait for it there until sync_timeout)."""
        self.left = True
        await self.client.stop_heartbeat()
        log.info("left_weight_groups", member=getattr(self.client, "member_id", ""))

    def during_step(self, step: int, on_loaded: Callable[[int], None]) -> StepLoads:
        """A watch for a newer version while `step` generates, where the plan allows it and the
        engines can take weights mid-batch (mid_step.py); else the null window."""
        if (
            self.plan is None
            or not self.partial
            or self.left
            or not P.load_during_step(self.plan, step, self.last_sync_step)
        ):
            return StepLoads()
        if self.hold is not None:
            arm_hold(self.pool.engines, self.hold)
            self.hold = None

        async def next_version() -> Any:
            while True:
                try:
                    return await self.client.wait_for_version(self.client.held + 1)
                except errors.DeadlineExceeded:  # nothing published for sync_timeout: wait on
                    continue

        async def load(version: Any) -> int:
            loaded = await self._load(step, version, mid_batch=True)
            log.info("weights_loaded_mid_step", step=step, version=loaded)
            return loaded

        return MidStepWatch(step, next_version, load, on_loaded)

    async def before_step(self, step: int) -> int | None:
        """Returns the version loaded for this step, or None when the held one stays.

        The receiver fetches the weights (and reports the transfer, failed or not); a failure to
        copy them into the engines afterwards is reported as a failed sync too.
        """
        decision = await self.client.begin_explorer_step(step)
        if decision.load is None:
            return None
        loaded = await self._load(step, decision.load)
        log.info("sync", step=step, version=loaded, reason=decision.reason)
        return loaded

    async def _load(self, step: int, version: Any, *, mid_batch: bool = False) -> int:
        """Fetch `version` (the receiver reports the transfer) and load it into the engines before
        or during `step`; a failure to load it into them is reported as a failed sync too."""
        tensors = await self.receiver.receive(version, into=None)
        try:
            await self.load_tensors(tensors, int(version.version), mid_batch=mid_batch)
        except Exception as exc:
            await self.client.report_sync(
                version.version, False, f"loading into the engines: {type(exc).__name__}: {exc}"
            )
            raise
        self.last_sync_step = step - 1  # what the ledger records: the steps done before the load
        return int(version.version)
