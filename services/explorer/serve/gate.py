"""One model version per request: each engine's requests and weight loads exclude each other.

A request holds its engine's gate while it generates and records the version the gate names: a
weight load waits until the requests in flight on that engine are done, holds back new ones
(so it is not starved) while it loads, then names the new version. No completion is ever sampled
from a half-loaded model or recorded under the wrong version, whatever the engine type.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


class EngineGate:
    """The gate of one engine (a BatchingEngine); `version` is the version of its weights."""

    def __init__(self, engine: Any, version: int = 0) -> None:
        self.engine = engine
        self.version = version
        self.active = 0
        self.loading = False
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[int]:
        """Hold the engine for one request; yields the version it generates with."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self.loading)
            self.active += 1
            version = self.version
        try:
            yield version
        finally:
            async with self._changed:
                self.active -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def loading_weights(self) -> AsyncIterator[None]:
        """Hold the engine alone: no request starts until the block ends (set `version` in it)."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self.loading)
            self.loading = True
            await self._changed.wait_for(lambda: self.active == 0)
        try:
            yield
        finally:
            async with self._changed:
                self.loading = False
                self._changed.notify_all()


def pick(gates: list[EngineGate]) -> EngineGate:
    """The engine to send a request to: not loading weights, fewest requests in flight."""
    return min(gates, key=lambda g: (g.loading, g.active))
