"""sync_style fully_async: the plan's decisions and the core's answers, on sequences worked by hand.

Plan used throughout unless said otherwise: trainer_sync_interval T=2, explorer_sync_interval E=3.
The trainer publishes after steps 2, 4, 6 …; an explorer looks for a newer version before step s
when (s - 1) - (steps done at its last sync) >= 3, and takes the newest one there is.
"""

from __future__ import annotations

import asyncio

import pytest

from services.common.config.synchronizer import SynchronizerConfig
from services.synchronizer import plan as P
from services.synchronizer.core import Synchronizer
from services.synchronizer.ledger import FileEntry

FILES = (FileEntry("model.safetensors", 1, "00"),)
ASYNC = P.Plan(style="fully_async", method="checkpoint", explorer_interval=3, trainer_interval=2, timeout=5)


def test_trainer_publishes_by_its_own_interval_and_nothing_else_decides_it() -> None:
    published, last = [], 0
    for step in range(1, 8):
        if P.trainer_publishes(ASYNC, step, last, requested=False)[0]:
            published.append(step)
            last = step
    assert published == [2, 4, 6]
    # sync_interval is only the fallback of the two intervals
    assert P.Plan(style="fully_async", interval=5).trainer_every == 5
    assert P.Plan(style="fully_async", interval=5, trainer_interval=1).trainer_every == 1


def test_explorer_checks_every_explorer_sync_interval_steps() -> None:
    # last synced with 0 steps done: checks before steps 4, 5, 6 … (until it syncs again)
    assert [s for s in range(1, 8) if P.async_check_due(ASYNC, s, last_sync_step=0)] == [4, 5, 6, 7]
    # synced when 3 steps were done: next check before step 7
    assert [s for s in range(4, 9) if P.async_check_due(ASYNC, s, last_sync_step=3)] == [7, 8]
    # under nccl: an explorer with 2 steps done (maybe running step 3) checks before step 4
    assert P.async_due_next(ASYNC, completed=2, last_sync_step=0)
    assert not P.async_due_next(ASYNC, completed=1, last_sync_step=0)


async def _register(sync: Synchronizer, *explorers: str) -> None:
    await sync.register("t", "trainer")
    for name in explorers:
        await sync.register(name, "explorer")


async def _train(sync: Synchronizer, step: int) -> bool:
    """One trainer step through the core; publishes when told. Never waits (asserted by the timeout)."""
    await asyncio.wait_for(sync.begin_trainer_step("t", step), 0.5)
    publish, _ = await asyncio.wait_for(sync.end_trainer_step("t", step), 0.5)
    if publish:
        await sync.publish_version("t", step, f"/ckpt/{step}", FILES)
    return publish


async def _explore(sync: Synchronizer, name: str, step: int, held: int) -> int:
    """Before explorer step `step`: returns the version it runs with (loads and reports when told)."""
    decision = await asyncio.wait_for(sync.begin_explorer_step(name, step, held), 0.5)
    if decision.load is None:
        return held
    await sync.report_sync(name, decision.load.version, True)
    return decision.load.version


async def test_trainer_runs_ahead_and_the_explorer_takes_the_newest_at_its_checks() -> None:
    # trainer 1,2 | v2 | 3,4 | v4 | 5,6 | v6 while the explorer does steps 1-3; then the explorer
    # skips v2 and v4 and loads v6 before step 4, and keeps it until step 7 whatever is published.
    sync = Synchronizer(ASYNC)
    await _register(sync, "e")
    held, versions = 0, []
    for step in range(1, 4):
        versions.append(held := await _explore(sync, "e", step, held))
    assert [await _train(sync, t) for t in range(1, 7)] == [False, True, False, True, False, True]
    for step in range(4, 7):
        versions.append(held := await _explore(sync, "e", step, held))
    assert [await _train(sync, t) for t in range(7, 9)] == [False, True]  # v8, not loaded before step 7
    versions.append(held := await _explore(sync, "e", 7, held))
    assert versions == [0, 0, 0, 6, 6, 6, 8]


async def test_explorer_ahead_is_not_held_without_a_staleness_bound() -> None:
    sync = Synchronizer(ASYNC)
    await _register(sync, "e")
    versions = [await _explore(sync, "e", s, 0) for s in range(1, 10)]  # no version ever published
    assert versions == [0] * 9


async def test_max_staleness_holds_the_explorer_and_the_trainer_publishes_on_its_request() -> None:
    # T=2, E=3, max_staleness 2. Explorer steps 1, 2 run on v0 (step 3 is trained at step >= 3,
    # needs v1). Before step 3 it is held: requested, so the trainer publishes after step 1
    # although T=2; v1 releases it. The trainer's calls return at once throughout.
    plan = P.Plan(
        style="fully_async",
        method="checkpoint",
        explorer_interval=3,
        trainer_interval=2,
        max_staleness=2,
        timeout=5,
    )
    sync = Synchronizer(plan)
    await _register(sync, "e")
    assert [await _explore(sync, "e", s, 0) for s in (1, 2)] == [0, 0]
    held = asyncio.create_task(sync.begin_explorer_step("e", 3, 0))
    await asyncio.sleep(0.05)
    assert not held.done()
    assert await _train(sync, 1)  # published on the explorer's request, not by T
    decision = await asyncio.wait_for(held, 1)
    assert decision.load is not None and decision.load.version == 1
    assert "max_staleness 2" in decision.reason
    await sync.report_sync("e", 1, True)
    assert not await _train(sync, 2)  # 1 step since v1 < T: no request pending, no publish
    assert await _train(sync, 3)


async def test_nccl_group_holds_only_explorers_that_check_at_their_next_boundary() -> None:
    plan = P.Plan(style="fully_async", method="nccl", explorer_interval=3, trainer_interval=2, timeout=5)
    sync = Synchronizer(plan)
    await _register(sync, "a", "b")
    for step in (1, 2, 3):  # a has done 2 steps and is running step 3: it checks before step 4
        await _explore(sync, "a", step, 0)
    await _explore(sync, "b", 1, 0)  # b is running step 1: its next check is before step 4
    await _train(sync, 1)
    await _train(sync, 2)
    group = sync.ledger.latest_group(2)
    assert group is not None and group.members == ["t", "a"]
    # b, at its check, finds no group with it: it runs on and asks for a re-publish
    for step in (2, 3):
        assert await _explore(sync, "b", step, 0) == 0
    decision = await sync.begin_explorer_step("b", 4, 0)
    assert decision.load is None and "re-publish" in decision.reason
    assert P.trainer_publishes(plan, 3, 2, sync.ledger.any_request())[0]


def test_config_keys_and_their_checks() -> None:
    cfg = SynchronizerConfig(
        sync_style="fully_async", sync_interval=2, explorer_sync_interval=3, sync_method="checkpoint"
    )
    plan = P.Plan.from_config(cfg)
    assert (plan.style, plan.explorer_every, plan.trainer_every) == ("fully_async", 3, 2)
    # the split intervals mean something only under fully_async
    with pytest.raises(ValueError, match="only sync_style fully_async"):
        SynchronizerConfig(sync_style="fixed", explorer_sync_interval=3)
    assert (
        SynchronizerConfig(sync_style="fixed", sync_interval=2, trainer_sync_interval=2).publish_interval == 2
    )
    # a staleness bound tighter than the publish interval can never be met
    with pytest.raises(ValueError, match="trainer_sync_interval"):
        SynchronizerConfig(sync_style="fully_async", trainer_sync_interval=3, max_staleness=2)


def test_a_due_check_stays_open_through_its_step_for_one_load_under_checkpoint() -> None:
    # E=3, last synced with 0 steps done: the checks before steps 4, 5, 6 … are due, so a version
    # published while step 4 (or a later one) generates may load mid-step
    assert [s for s in range(1, 8) if P.load_during_step(ASYNC, s, last_sync_step=0)] == [4, 5, 6, 7]
    # loaded during step 4 (or before it): the ledger counts 3 steps done, the next window is step 7
    assert [s for s in range(4, 10) if P.load_during_step(ASYNC, s, last_sync_step=3)] == [7, 8, 9]
    # E=1: every step after the first, until a load closes that step's window
    every = P.Plan(style="fully_async", method="checkpoint", explorer_interval=1)
    assert [s for s in range(1, 5) if P.load_during_step(every, s, last_sync_step=0)] == [2, 3, 4]
    assert not P.load_during_step(every, 2, last_sync_step=1)  # step 2 loaded once already


def test_no_load_mid_step_under_nccl_or_the_other_styles() -> None:
    # nccl: a version's group is formed at publish and joined at a step boundary
    assert not P.load_during_step(P.Plan(style="fully_async", method="nccl", explorer_interval=3), 5, 0)
    for style in ("fixed", "dynamic_by_trainer", "dynamic_by_explorer"):
        assert not P.load_during_step(P.Plan(style=style, method="checkpoint"), 5, 0)
