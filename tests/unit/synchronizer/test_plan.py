"""The sync plan and the synchronizer core, against orderings worked out by hand.

The concurrent tests run a fake trainer and fake explorers as asyncio tasks against the real core;
the "buffer" between them is modelled by making trainer step t wait until explorer step t is done
(one batch per step), which is what makes Trinity's fixed schedule deterministic.
"""

from __future__ import annotations

import asyncio

import pytest

from services.common import errors
from services.synchronizer import plan as P
from services.synchronizer.core import Synchronizer
from services.synchronizer.ledger import FileEntry

FILES = (FileEntry("model.safetensors", 1, "00"),)


def test_fixed_sync_points_of_the_worked_example() -> None:
    plan = P.Plan(interval=2, offset=1)
    # explorer 1,2,3 | sync | 4,5 | sync | 6,7 | sync
    assert [s for s in range(1, 9) if P.is_explorer_sync_point(plan, s)] == [3, 5, 7]
    # the version each explorer step runs with: the last sync point before it brought k*I
    assert [P.fixed_required_version(plan, s) for s in range(1, 9)] == [0, 0, 0, 2, 2, 4, 4, 6]
    # trainer 1,2 | publish | 3,4 | publish
    assert [t for t in range(1, 7) if P.trainer_publishes(plan, t, t - 1, False)[0]] == [2, 4, 6]


def test_one_step_off_policy_and_synchronous_plans() -> None:
    on_policy = P.Plan(interval=1, offset=0)
    assert [P.fixed_required_version(on_policy, s) for s in range(1, 5)] == [0, 1, 2, 3]
    off_by_one = P.Plan(interval=1, offset=1)
    assert [P.fixed_required_version(off_by_one, s) for s in range(1, 6)] == [0, 0, 1, 2, 3]


def test_staleness_floor_counts_from_the_step_that_trains_the_data() -> None:
    plan = P.Plan(interval=2, style="dynamic_by_trainer", max_staleness=2)
    # explorer step 3 is trained at step 3 at the earliest: it must hold version >= 1
    assert P.staleness_floor(plan, 3, trainer_done=0) == 1
    # a trainer that already did 5 steps trains it at step 6: version >= 4
    assert P.staleness_floor(plan, 3, trainer_done=5) == 4
    assert P.staleness_floor(P.Plan(), 9, trainer_done=0) == 0


def test_aliases_and_bad_plans() -> None:
    assert P.Plan(style="trainer_driven").style == "dynamic_by_trainer"
    assert P.Plan(style="explorer_driven").style == "dynamic_by_explorer"
    with pytest.raises(ValueError):
        P.Plan(style="sometimes")
    with pytest.raises(ValueError):
        P.Plan(max_staleness=0)


async def run_fixed(
    plan: P.Plan, explorer_steps: int, trainer_steps: int, method: str = "checkpoint"
) -> dict:
    """Fake trainer + one fake explorer on the real core; returns each side's event sequence."""
    sync = Synchronizer(plan)
    await sync.register("trainer", "trainer")
    await sync.register("explorer-0", "explorer")
    log: dict[str, list[str]] = {"trainer": [], "explorer": []}
    done = asyncio.Condition()
    explorer_done = 0

    async def trainer() -> None:
        for t in range(1, trainer_steps + 1):
            async with done:
                await done.wait_for(lambda t=t: explorer_done >= t)
            await sync.begin_trainer_step("trainer", t)
            log["trainer"].append(f"T{t}")
            publish, _ = await sync.end_trainer_step("trainer", t)
            if publish:
                await sync.publish_version("trainer", t, f"/ckpt/global_step_{t}", FILES)
                log["trainer"].append(f"publish v{t}")
                if method == "nccl":
                    assignment = await sync.join_weight_group("trainer", t, "127.0.0.1", 1234, "gloo")
                    await sync.report_sync("trainer", t, True)
                    while (
                        t < trainer_steps and assignment.group.state == "open"
                    ):  # the broadcast waits for all
                        await asyncio.sleep(0.005)

    async def explorer() -> None:
        nonlocal explorer_done
        held = 0
        for s in range(1, explorer_steps + 1):
            decision = await sync.begin_explorer_step("explorer-0", s, held)
            if decision.load is not None:
                if method == "nccl":
                    await sync.join_weight_group("explorer-0", decision.load.version)
                held = decision.load.version
                await sync.report_sync("explorer-0", held, True)
                log["explorer"].append(f"sync v{held}")
            log["explorer"].append(f"E{s}@v{held}")
            async with done:
                explorer_done = s
                done.notify_all()

    await asyncio.wait_for(asyncio.gather(trainer(), explorer()), 10)
    return log


@pytest.mark.parametrize("method", ["checkpoint", "nccl"])
async def test_worked_example_interval_2_offset_1(method: str) -> None:
    log = await run_fixed(
        P.Plan(interval=2, offset=1, method=method, timeout=5),
        explorer_steps=7,
        trainer_steps=6,
        method=method,
    )
    assert log["explorer"] == [
        "E1@v0",
        "E2@v0",
        "E3@v0",
        "sync v2",
        "E4@v2",
        "E5@v2",
        "sync v4",
        "E6@v4",
        "E7@v4",
    ]
    assert log["trainer"] == ["T1", "T2", "publish v2", "T3", "T4", "publish v4", "T5", "T6", "publish v6"]


async def test_synchronous_on_policy_holds_the_explorer_every_step() -> None:
    log = await run_fixed(P.Plan(interval=1, offset=0, timeout=5), explorer_steps=3, trainer_steps=2)
    assert log["explorer"] == ["E1@v0", "sync v1", "E2@v1", "sync v2", "E3@v2"]


async def test_one_step_off_policy_runs_one_step_ahead() -> None:
    # nccl: the trainer waits in its broadcast until the explorer reaches the sync point, so the
    # explorer gets exactly k*I (with checkpoints it would load whatever is newest by then)
    log = await run_fixed(
        P.Plan(interval=1, offset=1, timeout=5), explorer_steps=4, trainer_steps=3, method="nccl"
    )
    assert log["explorer"] == ["E1@v0", "E2@v0", "sync v1", "E3@v1", "sync v2", "E4@v2"]


async def two_explorers(plan: P.Plan) -> Synchronizer:
    sync = Synchronizer(plan)
    await sync.register("trainer", "trainer")
    await sync.register("explorer-a", "explorer")
    await sync.register("explorer-b", "explorer")
    return sync


async def test_fixed_style_with_two_explorers_holds_each_until_its_version() -> None:
    sync = await two_explorers(P.Plan(interval=2, offset=0, timeout=5, method="checkpoint"))
    for s in (1, 2):
        for e in ("explorer-a", "explorer-b"):
            assert (await sync.begin_explorer_step(e, s, 0)).load is None
    held_a = asyncio.create_task(sync.begin_explorer_step("explorer-a", 3, 0))
    held_b = asyncio.create_task(sync.begin_explorer_step("explorer-b", 3, 0))
    await asyncio.sleep(0.05)
    assert not held_a.done() and not held_b.done()  # both wait for version 2
    assert await sync.end_trainer_step("trainer", 1) == (False, "not a sync step")
    assert (await sync.end_trainer_step("trainer", 2))[0]
    await sync.publish_version("trainer", 2, "/c/global_step_2", FILES)
    assert (await held_a).load.version == 2 and (await held_b).load.version == 2


async def test_trainer_driven_explorers_pick_up_new_versions_without_waiting() -> None:
    sync = await two_explorers(P.Plan(interval=2, style="trainer_driven", timeout=5, method="checkpoint"))
    assert (await sync.begin_explorer_step("explorer-a", 1, 0)).load is None
    assert not (await sync.end_trainer_step("trainer", 1))[0]
    assert (await sync.end_trainer_step("trainer", 2))[0]
    await sync.publish_version("trainer", 2, "/c/global_step_2", FILES)
    # a picks v2 up at its next boundary; b, further ahead, too — nobody was held
    assert (await sync.begin_explorer_step("explorer-a", 2, 0)).load.version == 2
    await sync.report_sync("explorer-a", 2, True)
    assert (await sync.begin_explorer_step("explorer-b", 5, 0)).load.version == 2
    assert (await sync.begin_explorer_step("explorer-a", 3, 2)).load is None
    assert not (await sync.end_trainer_step("trainer", 3))[0]
    assert (await sync.end_trainer_step("trainer", 4))[0]


async def test_explorer_driven_request_makes_the_trainer_publish() -> None:
    sync = await two_explorers(P.Plan(interval=2, style="explorer_driven", timeout=5, method="checkpoint"))
    for s in (1, 2):
        assert (await sync.begin_explorer_step("explorer-a", s, 0)).load is None
    assert not (await sync.end_trainer_step("trainer", 1))[0]  # nobody asked yet
    # a ran 2 steps: due; nothing newer exists, so it runs on and the request is recorded
    assert (await sync.begin_explorer_step("explorer-a", 3, 0)).load is None
    assert await sync.begin_trainer_step("trainer", 2)  # the trainer already knows
    assert await sync.end_trainer_step("trainer", 2) == (True, "an explorer asked for a newer version")
    await sync.publish_version("trainer", 2, "/c/global_step_2", FILES)
    assert (await sync.begin_explorer_step("explorer-a", 4, 0)).load.version == 2
    await sync.report_sync("explorer-a", 2, True)
    # b has run only 1 step: not due, keeps v0; after 2 steps it takes v2
    assert (await sync.begin_explorer_step("explorer-b", 2, 0)).load is None
    assert (await sync.begin_explorer_step("explorer-b", 3, 0)).load.version == 2
    # a synced after 3 steps; due again before step 6
    assert (await sync.begin_explorer_step("explorer-a", 5, 2)).load is None
    assert not (await sync.end_trainer_step("trainer", 3))[0]


async def test_max_staleness_holds_a_fast_explorer() -> None:
    sync = await two_explorers(
        P.Plan(interval=2, style="trainer_driven", max_staleness=2, timeout=5, method="checkpoint")
    )
    for s in (1, 2):
        assert (await sync.begin_explorer_step("explorer-a", s, 0)).load is None
    held = asyncio.create_task(sync.begin_explorer_step("explorer-a", 3, 0))  # trained at 3: needs v >= 1
    await asyncio.sleep(0.05)
    assert not held.done()
    await sync.end_trainer_step("trainer", 1)
    await asyncio.sleep(0.05)
    assert not held.done()
    assert (await sync.end_trainer_step("trainer", 2))[0]
    await sync.publish_version("trainer", 2, "/c/global_step_2", FILES)
    decision = await held
    assert decision.load.version == 2 and "max_staleness" in decision.reason


async def test_hold_ends_with_deadline_exceeded() -> None:
    sync = await two_explorers(P.Plan(interval=1, timeout=0.1, method="checkpoint"))
    with pytest.raises(errors.DeadlineExceeded, match="version >= 1"):
        await sync.begin_explorer_step("explorer-a", 2, 0)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_dead_member_is_reported_and_fails_its_group() -> None:
    clock = Clock()
    sync = Synchronizer(P.Plan(interval=1, timeout=5), member_timeout_s=3, clock=clock)
    await sync.register("trainer", "trainer")
    await sync.register("explorer-a", "explorer")
    await sync.register("explorer-b", "explorer")
    await sync.publish_version("trainer", 1)
    group = sync.ledger.latest_group(1)
    assert group.members == ["trainer", "explorer-a", "explorer-b"]
    await sync.join_weight_group("trainer", 1, "127.0.0.1", 4321, "gloo")
    a = await sync.join_weight_group("explorer-a", 1)
    assert (a.rank, a.group.master_port) == (1, 4321)
    clock.now += 2
    await sync.heartbeat("trainer", 1, 1)
    await sync.heartbeat("explorer-a", 0, 0)
    clock.now += 2
    assert await sync.sweep() == ["explorer-b"]
    assert group.state == "failed" and "explorer-b" in group.error
    assert [m.alive for m in sync.ledger.members.values()] == [True, True, False]
    # the next group leaves the dead one out
    await sync.publish_version("trainer", 2)
    assert sync.ledger.latest_group(2).members == ["trainer", "explorer-a"]


async def test_restarted_explorer_rejoins_where_it_left() -> None:
    sync = await two_explorers(P.Plan(interval=1, timeout=5, method="checkpoint"))
    for s in (1, 2, 3):
        await sync.begin_explorer_step("explorer-a", s, s - 1)
        await sync.publish_version("trainer", s, f"/c/global_step_{s}", FILES)
    latest, last_step = await sync.register("explorer-a", "explorer")
    assert (latest.version, last_step) == (3, 2)
    decision = await sync.begin_explorer_step("explorer-a", 3, 0)  # lost its weights
    assert decision.load.version == 3 and decision.load.checkpoint_path == "/c/global_step_3"


async def test_restarted_explorer_under_nccl_asks_for_a_republish() -> None:
    sync = await two_explorers(P.Plan(interval=2, timeout=5, method="nccl"))
    await sync.publish_version("trainer", 2)
    await sync.register("explorer-a", "explorer")  # restart: its group membership is void
    assert sync.ledger.latest_group(2).state == "failed"
    decision = await sync.begin_explorer_step("explorer-a", 4, 0)
    assert decision.load is None and "re-publish" in decision.reason
    assert await sync.end_trainer_step("trainer", 3) == (True, "an explorer asked for a newer version")


async def test_nccl_slow_explorer_joins_a_scheduled_group_at_its_sync_point_not_before() -> None:
    """I=2, O=1 (the worked example): version 4 is published while explorer-b is still before its
    step 5. The group includes it, but the plan says step 5 runs with version 2 and the sync to 4
    comes after step 5: it joins then (the trainer's broadcast waits), not at the step-5 boundary."""
    sync = await two_explorers(P.Plan(interval=2, offset=1, timeout=5, method="nccl"))
    await sync.publish_version("trainer", 2)
    for member in ("explorer-a", "explorer-b"):
        assert (await sync.begin_explorer_step(member, 4, 0)).load.version == 2
        await sync.report_sync(member, 2, True)
    await sync.publish_version("trainer", 4)
    early = await sync.begin_explorer_step("explorer-b", 5, 2)
    assert early.load is None, early.reason
    due = await sync.begin_explorer_step("explorer-b", 6, 2)
    assert due.load.version == 4 and "sync point after step 5" in due.reason


async def test_member_not_in_group_and_stale_publish_are_refused() -> None:
    sync = await two_explorers(P.Plan(interval=1, timeout=5, style="explorer_driven"))
    await sync.publish_version("trainer", 1)  # nobody asked: no group
    with pytest.raises(errors.FailedPrecondition, match="no weight group"):
        await sync.join_weight_group("explorer-a", 1)
    with pytest.raises(errors.FailedPrecondition, match="not newer"):
        await sync.publish_version("trainer", 1, "/elsewhere")
    with pytest.raises(errors.NotFound):
        await sync.begin_explorer_step("ghost", 1, 0)
