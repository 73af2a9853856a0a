"""The explorer's side of mode colocate: its engine maps the trainer's parameters (transfer/shared.py).

The first version the synchronizer names is "loaded" by pointing the engine's parameters at the
trainer's shared files, in the directory the version names (its own copy is then freed); later
versions load nothing, since the trainer's optimizer already wrote them where the engine reads.
On a GPU the engine's parameters are opened on the trainer's CUDA memory instead (cuda_share.py);
a restarted trainer has new memory (a new `owner` in the manifest), so the engine attaches again.
What this class adds to the plan is the weights lock: held shared from the moment a step's weights
are settled until the explorer next asks the synchronizer, so the trainer's update (which holds it
exclusively) never lands while a step or an evaluation generates. The version the explorer reports
for its rows is the one the trainer wrote beside the weights under that lock, so a row's version
is the weights' even when a restarted explorer got there after the trainer had moved on.

A vLLM engine cannot run on the trainer's tensors (it keeps its own layout: fused projections, on
CPU weights packed for its matmuls), so it copies each version from the shared files into its own
parameters (VLLMEngine.load_shared: the worker maps the files itself, only their directory crosses
a process boundary). The lock is held shared for that copy only, and the version labelling the
rows is the one written beside the weights then.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from services.common.logging import get_logger
from services.explorer.engines.base import EnginePool
from services.explorer.weight_sync import ServiceWeightSync
from services.synchronizer import plan as P
from services.synchronizer.transfer import cuda_share, shared

log = get_logger("explorer.colocate")


class SharedWeightSync(ServiceWeightSync):
    """ServiceWeightSync for mode colocate (see the module docstring)."""

    def __init__(self, pool: EnginePool, client: Any, receiver: Any, plan: P.Plan | None = None) -> None:
        super().__init__(pool, client, receiver, plan)
        self.partial = False  # weights change only between steps, under the lock
        self.directory: str | None = None  # set by the first version loaded
        self.owner: str | None = None  # on a GPU: whose CUDA memory the engine's parameters are
        self.shared_lock: shared.WeightsLock | None = None
        self.copies = all(hasattr(e.engine, "load_shared") for e in pool.engines)
        """The engines copy each version from the shared files (vLLM) instead of mapping them once."""

    async def before_step(self, step: int) -> int | None:
        """Let the trainer update while the synchronizer holds us; take the lock back before the step."""
        if self.copies:  # nothing held between loads: the engine reads its own copy
            return await super().before_step(step)
        if self.shared_lock is not None:
            await asyncio.to_thread(cuda_share.settle)  # our kernels done reading before the trainer writes
            await asyncio.to_thread(self.shared_lock.release)
        loaded = await super().before_step(step)
        if self.shared_lock is None or self.directory is None:
            return loaded  # still on the engine's own weights (version 0)
        await asyncio.to_thread(self.shared_lock.acquire, False)
        written = shared.read_version(self.directory)
        held = loaded if loaded is not None else self.client.held
        if written is not None and written != held:
            log.warning("shared_weights_newer", step=step, ledger_version=held, weights_version=written)
            for engine in self.pool.engines:
                engine.engine.model_version = written
            return written
        return loaded

    async def _load(self, step: int, version: Any, *, mid_batch: bool = False) -> int:
        """Attach to the shared weights (the first time; vLLM: copy them) and report the sync."""
        number, directory = int(version.version), str(version.checkpoint_path)
        held = number
        async with self.lock:
            if self.copies:
                held = await self._copy(directory, number)
            elif directory != self.directory or shared.owner(directory) != self.owner:
                await self._attach(directory, number)  # first load, or a restarted trainer's GPU memory
            else:
                for engine in self.pool.engines:
                    await engine.update_weights_async(lambda e: None, number)
        await self.client.report_sync(number, True)
        self.last_sync_step = step - 1
        return held

    async def _copy(self, directory: str, number: int) -> int:
        """Copy the shared weights into every engine under the shared lock; returns the version they
        hold (the trainer's VERSION, read under the same lock; the ledger's `number` if none)."""
        lock = shared.WeightsLock(directory)
        started = time.perf_counter()
        await asyncio.to_thread(lock.acquire, False)
        try:
            written = shared.read_version(directory)
            held = written if written is not None else number
            size = 0
            for engine in self.pool.engines:
                size += await engine.update_weights_async(lambda e: e.load_shared(directory), held)  # type: ignore[attr-defined]
        except Exception as exc:
            await self.client.report_sync(number, False, f"copying {directory}: {type(exc).__name__}: {exc}")
            raise
        finally:
            await asyncio.to_thread(lock.close)
        if held != number:
            log.warning("shared_weights_newer", ledger_version=number, weights_version=held)
        seconds = round(time.perf_counter() - started, 3)
        log.info(
            "weights_copied", directory=directory, mib=round(size / 2**20, 1), version=held, seconds=seconds
        )
        return held

    async def _attach(self, directory: str, number: int) -> None:
        lock = shared.WeightsLock(directory)
        await asyncio.to_thread(lock.acquire, False)
        before = cuda_share.allocated_mib()
        try:
            owner = shared.owner(directory)
            size = 0
            for engine in self.pool.engines:
                size += await engine.update_weights_async(
                    lambda e: shared.attach_parameters(e.model, directory),  # type: ignore[attr-defined]
                    number,
                )
        except Exception as exc:
            await self.client.report_sync(
                number, False, f"attaching {directory}: {type(exc).__name__}: {exc}"
            )
            raise
        finally:
            await asyncio.to_thread(lock.release)
        if self.shared_lock is not None:
            self.shared_lock.close()
        self.directory, self.shared_lock, self.owner = directory, lock, owner
        log.info(
            "weights_attached",
            directory=directory,
            mib=round(size / 2**20, 1),
            version=number,
            owner=owner,
            cuda_allocated_mib_before=before,
            cuda_allocated_mib=cuda_share.allocated_mib(),
        )

    async def leave(self) -> None:
        await super().leave()
        if self.shared_lock is not None:
            await asyncio.to_thread(self.shared_lock.release)
