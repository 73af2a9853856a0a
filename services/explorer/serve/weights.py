"""New weights for the proxy, by the sync plan, loaded between requests (gate.py).

The proxy is an explorer member of the synchronizer whose steps are its checks: every
explorer.service_status_check_interval seconds it begins step s+1 and loads what the plan names
(sync_style dynamic_by_trainer: every version the trainer publishes; fully_async: the newest one
every explorer_sync_interval checks), from the checkpoint files the trainer published. The engines
load in turns of engine_num - min_running_model_num (at least one), so the others keep serving.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.common.logging import get_logger
from services.explorer.serve.gate import EngineGate

log = get_logger("explorer.serve.weights")


class ServeWeights:
    """Asks the synchronizer (client: SynchronizerClient, receiver: WeightReceiver) and loads."""

    def __init__(self, gates: list[EngineGate], client: Any, receiver: Any, *, min_running: int = 1) -> None:
        self.gates = gates
        self.client = client
        self.receiver = receiver
        self.turn = max(1, len(gates) - min_running)
        self.step = int(getattr(client, "step", 0))

    @property
    def version(self) -> int:
        """The oldest version an engine serves."""
        return min(g.version for g in self.gates)

    async def check(self) -> int | None:
        """One step of the plan: load the version it names; returns it (None: nothing to load)."""
        self.step += 1
        decision = await self.client.begin_explorer_step(self.step)
        if decision.load is None:
            return None
        version = int(decision.load.version)
        tensors = await self.receiver.receive(decision.load, into=None)
        try:
            for start in range(0, len(self.gates), self.turn):
                group = self.gates[start : start + self.turn]
                await asyncio.gather(*(self._load(gate, tensors, version) for gate in group))
        except Exception as exc:
            await self.client.report_sync(
                version, False, f"loading into the engines: {type(exc).__name__}: {exc}"
            )
            raise
        log.info("serve_weights_loaded", version=version, step=self.step, reason=decision.reason)
        return version

    async def _load(self, gate: EngineGate, tensors: dict[str, Any], version: int) -> None:
        async with gate.loading_weights():
            await gate.engine.update_weights_async(lambda e: e.update_weights(tensors.items()), version)
            gate.version = version

    async def run(self, interval: float) -> None:
        """Check every `interval` seconds until cancelled; a failed check is logged and retried."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the proxy keeps serving the weights it has
                log.warning(
                    "serve_weights_check_failed", error=f"{type(exc).__name__}: {exc}", step=self.step
                )
