"""A weight load waits for the requests in flight, holds new ones back, and names the new version."""

from __future__ import annotations

import asyncio

import pytest

from services.explorer.serve.gate import EngineGate, pick


@pytest.mark.asyncio
async def test_a_load_waits_for_requests_and_requests_wait_for_the_load() -> None:
    gate = EngineGate(engine=None, version=0)
    events: list[str] = []
    release_first = asyncio.Event()

    async def request(name: str, hold: asyncio.Event | None = None) -> None:
        async with gate.serving() as version:
            events.append(f"{name} start v{version}")
            if hold is not None:
                await hold.wait()
            events.append(f"{name} end")

    async def load() -> None:
        async with gate.loading_weights():
            events.append("load")
            gate.version = 1

    first = asyncio.create_task(request("r1", release_first))
    await asyncio.sleep(0)
    loading = asyncio.create_task(load())
    await asyncio.sleep(0.01)
    second = asyncio.create_task(request("r2"))  # arrives while the load waits: it must not overtake
    await asyncio.sleep(0.01)
    assert events == ["r1 start v0"] and gate.loading
    release_first.set()
    await asyncio.gather(first, loading, second)
    assert events == ["r1 start v0", "r1 end", "load", "r2 start v1", "r2 end"]


def test_requests_go_to_the_least_busy_engine_not_loading() -> None:
    a, b, c = EngineGate("a"), EngineGate("b"), EngineGate("c")
    a.active, b.active, c.active = 2, 1, 0
    c.loading = True
    assert pick([a, b, c]) is b
