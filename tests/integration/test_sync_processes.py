"""Real processes exchanging real torch weights through the synchronizer.

A synchronizer (`python -m services.synchronizer`), one stand-in trainer and two stand-in explorers
(tests/integration/sync_member.py, separate Python processes) move weights through a gloo group
and through checkpoint files. Checked: bit-for-bit equality of every received tensor, the version
each explorer step ran with against the plan, and what happens when an explorer is SIGKILLed in
the middle of a broadcast.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time

from services.synchronizer.client import SynchronizerClient
from tests.integration.sync_processes import Run


async def run_worked_example(tmp_path: pathlib.Path, method: str) -> Run:
    run = Run(tmp_path, sync_method=method, sync_interval=2, sync_offset=1, sync_timeout=20)
    await run.play(
        ("trainer", "trainer", "6", "--min-explorers", "2"),
        ("explorer", "explorer-a", "8"),
        ("explorer", "explorer-b", "8", "--step-s", "0.1"),
    )
    return run


def check_worked_example(run: Run) -> None:
    # explorer 1,2,3 | sync v2 | 4,5 | sync v4 | 6,7 | sync v6 | 8; trainer 1,2 | v2 | 3,4 | v4 | 5,6 | v6
    for explorer in ("explorer-a", "explorer-b"):
        steps = [(e["step"], e["version"]) for e in run.of(explorer, "step")]
        assert steps == [(1, 0), (2, 0), (3, 0), (4, 2), (5, 2), (6, 4), (7, 4), (8, 6)]
        syncs = run.of(explorer, "sync")
        assert [e["version"] for e in syncs] == [2, 4, 6] and all(e["exact"] for e in syncs)
        assert all(e["exact"] for e in run.of(explorer, "step"))
    trainer = [(e["event"], e.get("step") or e.get("version")) for e in run.of("trainer", "train", "publish")]
    assert trainer == [
        ("train", 1),
        ("train", 2),
        ("publish", 2),
        ("train", 3),
        ("train", 4),
        ("publish", 4),
        ("train", 5),
        ("train", 6),
        ("publish", 6),
    ]


async def test_gloo_group_worked_example_two_explorers_bit_exact(tmp_path: pathlib.Path) -> None:
    run = await run_worked_example(tmp_path, "nccl")
    try:
        check_worked_example(run)
        async with await SynchronizerClient.connect(f"127.0.0.1:{run.port}") as client:
            status = await client.get_status()
            assert [(g.version, g.state, list(g.members)) for g in status.groups][:2] == [
                (2, "done", ["trainer", "explorer-a", "explorer-b"]),
                (4, "done", ["trainer", "explorer-a", "explorer-b"]),
            ]
            info = await client.get_info()
            assert info.info.service == "synchronizer" and info.info.stats["latest_version"] == 6
    finally:
        run.stop()


async def test_checkpoint_worked_example_two_explorers_bit_exact(tmp_path: pathlib.Path) -> None:
    run = await run_worked_example(tmp_path, "checkpoint")
    try:
        check_worked_example(run)
        run_dir = tmp_path / "runs" / "p" / "n"
        # monitor: TensorBoard; synchronizer: its ledger
        kept = sorted(p.name for p in run_dir.iterdir() if p.name not in ("monitor", "synchronizer"))
        # v2 was pruned once both explorers held v4 (keep_sync_checkpoints: 2 newest); no temp dirs
        assert kept == ["global_step_4", "global_step_6"]
        assert sorted(os.listdir(run_dir / "global_step_6")) == [
            "SYNC_ONLY",
            "config.json",
            "manifest.json",
            "model.safetensors",
        ]
    finally:
        run.stop()


async def test_sigkilled_explorer_fails_the_sync_and_the_next_sync_succeeds(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path, sync_method="nccl", sync_interval=1, sync_offset=0, sync_timeout=6)
    await run.start_synchronizer()
    run.member("trainer", "trainer", 4, "--min-explorers", "2")
    run.member("explorer", "explorer-a", 5)
    run.member("explorer", "explorer-b", 5, "--stall-at-version", "2")
    try:
        await run.wait_for(
            lambda: run.of("explorer-b", "stalled"), 60, "explorer-b to stall inside the v2 broadcast"
        )
        killed_at = time.time()
        os.kill(run.procs["explorer-b"].pid, signal.SIGKILL)
        await run.wait_for(
            lambda: run.all_done("trainer", "explorer-a"), 60, "trainer and explorer-a to finish"
        )
        # the others failed v2 loudly, within sync_timeout of the kill, naming the group
        for who in ("trainer", "explorer-a"):
            failed = run.of(who, "sync_failed")
            assert [e["version"] for e in failed] == [2], failed
            assert "weight group trinity-weights-v2" in failed[0]["error"]
            assert failed[0]["t"] - killed_at < 6 + 2
        # the trainer was not restarted and the next syncs, in a rebuilt group, succeeded
        assert [e["version"] for e in run.of("trainer", "publish")] == [1, 3, 4]
        assert [(e["version"], e["exact"]) for e in run.of("explorer-a", "sync")] == [
            (1, True),
            (3, True),
            (4, True),
        ]
        assert [e["version"] for e in run.of("explorer-a", "step")] == [0, 1, 1, 3, 4]
        assert all(e["exact"] for e in run.of("explorer-a", "step"))
        async with await SynchronizerClient.connect(f"127.0.0.1:{run.port}") as client:
            status = await client.get_status()
            dead = {m.member_id: (m.alive, m.step) for m in status.members}["explorer-b"]
            assert dead == (False, 2)  # reported dead at its last step (trainer and a exited since)
            groups = [(g.version, g.state, len(g.members)) for g in status.groups]
            assert groups == [(1, "done", 3), (2, "failed", 3), (3, "done", 2), (4, "done", 2)]
    finally:
        run.stop()
