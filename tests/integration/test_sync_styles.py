"""The sync styles with real processes: trainer_driven / explorer_driven explorers at their own pace,
max_staleness holding explorers that run ahead, and fully_async (Trinity v0.6) within the staleness
bound; one synchronizer, a stand-in trainer and two stand-in explorers (sync_member.py) moving real
weights through a gloo group or checkpoint files."""

from __future__ import annotations

import pathlib

import pytest

from tests.integration.sync_processes import Run, trainer_events, versions_of


async def run_pinned(tmp_path: pathlib.Path, method: str, style: str) -> Run:
    """Trainer (6 steps) + explorer-a (lead 0, 7 steps) + explorer-b (lead 2, 9 steps), pinned pace
    (sync_member.py): explorer X asks before its step s when the trainer has ended exactly s-1-lead_X."""
    run = Run(
        tmp_path,
        sync_method=method,
        sync_style=style,
        sync_interval=2,
        sync_timeout=20,
        heartbeat_interval_s=0.1,
    )
    await run.play(
        ("trainer", "trainer", "6", "--min-explorers", "2", "--lead", "explorer-b=2"),
        ("explorer", "explorer-a", "7", "--lead", "0"),
        ("explorer", "explorer-b", "9", "--lead", "2"),
    )
    return run


# Each style once per method; the nccl runs spell the style by its Trinity alias.
@pytest.mark.parametrize(
    ("method", "style"), [("checkpoint", "dynamic_by_trainer"), ("nccl", "trainer_driven")]
)
async def test_trainer_driven_explorers_load_the_latest_version_at_their_own_pace(
    tmp_path: pathlib.Path, method: str, style: str
) -> None:
    # The trainer publishes when 2 steps passed since the last version: T1 T2 v2 T3 T4 v4 T5 T6 v6.
    # An explorer is never held; before its step s it loads the latest version if newer than its
    # own (under nccl every live explorer is in each version's group). The trainer has ended
    # s-1-lead then, so the explorer loads 2*floor((s-1-lead)/2):
    #   a (lead 0), s=1..7, trainer ended 0..6:  0 0 2 2 4 4 6
    #   b (lead 2), s=1..9, trainer ended ≤0..6: 0 0 0 0 2 2 4 4 6
    # (under sync_style fixed with sync_offset 0, b would be held before its step 3 for v2 and the
    # trainer, waiting for b's step 5, would never make it: the dynamic style is what lets b run on.)
    run = await run_pinned(tmp_path, method, style)
    try:
        assert trainer_events(run) == ["T1", "T2", "v2", "T3", "T4", "v4", "T5", "T6", "v6"]
        assert versions_of(run, "explorer-a") == ([0, 0, 2, 2, 4, 4, 6], [2, 4, 6])
        assert versions_of(run, "explorer-b") == ([0, 0, 0, 0, 2, 2, 4, 4, 6], [2, 4, 6])
    finally:
        run.stop()


# An explorer that ran 2 steps since its last sync (last_sync_step: steps done when it loaded)
# loads the latest version if it can, else asks; the trainer publishes after a step in which
# someone asked, and only then. Before trainer step t, a asks before its step t, b before t+2.
# checkpoint (any explorer can load any published version):
#   T1: b before 3: due, nothing newer, asks                                -> T1 publishes v1
#   T2: a before 2: 1 step, no; b before 4: due, loads v1 (synced at 3)      -> no publish
#   T3: a before 3: due, loads v1 (synced at 2); b before 5: 1 step, no      -> no publish
#   T4: a before 4: 1 step, no; b before 6: due, nothing newer than v1, asks -> T4 publishes v4
#   T5: a before 5: due, loads v4 (at 4); b before 7: due, loads v4 (at 6)   -> no publish
#   T6: a before 6, b before 8: 1 step since, no                             -> no publish
#   after T6: a before 7, b before 9: due, nothing newer, ask (nobody trains any more)
# nccl (a version's weight group holds only the explorers that asked for it; a due explorer left
# out of the group runs on and asks for a re-publish):
#   T1: b asks                                                       -> v1, group [b]
#   T2: b before 4 loads v1 (synced at 3)                            -> no publish
#   T3: a before 3: due, v1 exists but a is not in its group: asks   -> v3, group [a]
#   T4: a before 4: due (never synced), loads v3 (at 3); b before 6: due, not in v3's group: asks
#                                                                    -> v4, group [b]
#   T5: a before 5: 1 step, no; b before 7 loads v4 (at 6)           -> no publish
#   T6: a before 6: due, not in v4's group: asks; b before 8: no     -> v6, group [a]
#   after T6: a before 7 loads v6; b before 9: due, not in v6's group: asks
EXPLORER_DRIVEN = {
    "checkpoint": (
        ["T1", "v1", "T2", "T3", "T4", "v4", "T5", "T6"],
        ([0, 0, 1, 1, 4, 4, 4], [1, 4]),
        ([0, 0, 0, 1, 1, 1, 4, 4, 4], [1, 4]),
    ),
    "nccl": (
        ["T1", "v1", "T2", "T3", "v3", "T4", "v4", "T5", "T6", "v6"],
        ([0, 0, 0, 3, 3, 3, 6], [3, 6]),
        ([0, 0, 0, 1, 1, 1, 4, 4, 4], [1, 4]),
    ),
}


@pytest.mark.parametrize(
    ("method", "style"), [("checkpoint", "dynamic_by_explorer"), ("nccl", "explorer_driven")]
)
async def test_explorer_driven_versions_are_published_when_an_explorer_asks(
    tmp_path: pathlib.Path, method: str, style: str
) -> None:
    trainer, explorer_a, explorer_b = EXPLORER_DRIVEN[method]
    run = await run_pinned(tmp_path, method, style)
    try:
        assert trainer_events(run) == trainer
        assert versions_of(run, "explorer-a") == explorer_a
        assert versions_of(run, "explorer-b") == explorer_b
    finally:
        run.stop()


async def test_max_staleness_holds_explorers_that_run_ahead(tmp_path: pathlib.Path) -> None:
    # dynamic_by_trainer, interval 1 (a version after every trainer step), max_staleness 2; both
    # explorers run free and say a step is done only when they ask before the next (--quiet-steps),
    # so trainer step t starts after both asked before step t+1 and has not started step s-1 when
    # an explorer asks before step s: the newest version then is <= s-2. Explorer step s is trained
    # at step s, so it needs version >= s-2: steps 1, 2 run on v0; before step s >= 3 the explorer
    # is held until version s-2 and loads it. Without the bound they would run all 6 steps on v0.
    run = Run(
        tmp_path,
        sync_method="checkpoint",
        sync_style="dynamic_by_trainer",
        sync_interval=1,
        max_staleness=2,
        sync_timeout=20,
        heartbeat_interval_s=0.1,
    )
    await run.play(
        ("trainer", "trainer", "5", "--min-explorers", "2"),
        ("explorer", "explorer-a", "6", "--quiet-steps"),
        ("explorer", "explorer-b", "6", "--quiet-steps", "--step-s", "0.1"),
    )
    try:
        assert trainer_events(run) == ["T1", "v1", "T2", "v2", "T3", "v3", "T4", "v4", "T5", "v5"]
        for explorer in ("explorer-a", "explorer-b"):
            assert versions_of(run, explorer) == ([0, 0, 1, 2, 3, 4], [1, 2, 3, 4])
            assert all("max_staleness 2" in e["reason"] for e in run.of(explorer, "sync"))
    finally:
        run.stop()


@pytest.mark.parametrize("sync_method", ["checkpoint", "nccl"])
async def test_fully_async_two_explorers_within_the_staleness_bound(
    tmp_path: pathlib.Path, sync_method: str
) -> None:
    # fully_async, trainer_sync_interval 1, explorer_sync_interval 2, max_staleness 2; two explorers
    # at different paces. The trainer publishes after every step and is never held for a sync (its
    # events are T1 v1 T2 v2 …); an explorer loads only every 2 steps since its last sync (or when the
    # bound holds it), and every explorer step s, trained at step s here (the member trainer starts
    # step t once each explorer finished step t), ran on a version >= s - 2.
    run = Run(
        tmp_path,
        sync_method=sync_method,
        sync_style="fully_async",
        sync_interval=1,
        explorer_sync_interval=2,
        max_staleness=2,
        sync_timeout=20,
        heartbeat_interval_s=0.1,
    )
    await run.play(
        ("trainer", "trainer", "6", "--min-explorers", "2"),
        ("explorer", "explorer-a", "7"),
        ("explorer", "explorer-b", "7", "--step-s", "0.15"),
    )
    try:
        events = trainer_events(run)
        # nccl: v6's group may name an explorer that has ended its steps (these stand-ins never
        # leave the groups as the real explorer does before its last step): that publish then fails.
        if sync_method == "nccl" and events[-1] == "T6":
            events.append("v6")
        assert events == [x for t in range(1, 7) for x in (f"T{t}", f"v{t}")]
        for explorer in ("explorer-a", "explorer-b"):
            ran_with, loaded = versions_of(run, explorer)
            assert all(step - version <= 2 for step, version in enumerate(ran_with, 1)), ran_with
            assert loaded, f"{explorer} never picked up a new version"
            # between two loads at least explorer_sync_interval steps ran, unless the bound forced it
            changes = [s for s in range(2, len(ran_with) + 1) if ran_with[s - 1] != ran_with[s - 2]]
            reasons = [e["reason"] for e in run.of(explorer, "sync")]
            for (prev, nxt), why in zip(zip([1, *changes], changes, strict=False), reasons, strict=True):
                # nccl: a group formed with this explorer in it (it asked) is joined at once
                forced = "max_staleness" in why or "weight group" in why
                assert nxt - prev >= 2 or forced, (ran_with, reasons)
    finally:
        run.stop()
