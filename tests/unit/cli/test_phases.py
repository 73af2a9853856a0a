"""The per-service step-time breakdown in summary.json and the end table (cli/phases.py)."""

from __future__ import annotations

import json
import pathlib

import pytest

from services.cli.phases import EXPLORER_PHASES, TRAINER_PHASES, breakdown, format_phases, stage_phases
from services.common.config import load_config


def trainer_step(at: float, **times: float) -> dict:
    return {"step": 1, "time": at, "rows": [], "metrics": {f"time/{k}": v for k, v in times.items()}}


def test_trainer_breakdown_by_hand() -> None:
    records = [
        # first record: wall = the named phases = 0.5 + (1.0 - 0.8) + (0.8 - 0.1) + 0.1 + 0.1 + 0.1 = 1.7
        trainer_step(100.0, read=0.5, step=1.0, update=0.8, optimizer=0.1, ack=0.1, publish=0.1),
        # 3.0 s after the first; named 1.0 + 0.5 + 0.5 = 2.0, so 1.0 s is `other` (e.g. a checkpoint)
        trainer_step(103.0, read=1.0, step=0.5, update=0.5, replay_journal=0.5),
    ]
    got = breakdown(records, TRAINER_PHASES)
    assert got["steps"] == 2 and got["wall_s"] == pytest.approx(4.7)
    assert got["phases"] == pytest.approx(
        {
            "wait_read": 1.5,
            "prepare": 0.2,
            "forward_backward": 1.2,
            "optimizer": 0.1,
            "journal": 0.5,
            "ack": 0.1,
            "publish": 0.1,
            "other": 1.0,
        }
    )
    assert sum(got["share"].values()) == pytest.approx(1.0, abs=1e-3)
    assert got["share"]["wait_read"] == pytest.approx(1.5 / 4.7, abs=1e-4)


def test_records_closer_than_their_phases_count_no_negative_other() -> None:
    # two explorers' clocks or a coarse timestamp: the gap (0.1 s) is less than the phases (0.6 s)
    records = [
        {"step": 1, "time": 10.0, "metrics": {"time/rollout_s": 1.0}},
        {"step": 2, "time": 10.1, "metrics": {"time/rollout_s": 0.5, "time/write_s": 0.1}},
    ]
    got = breakdown(records, EXPLORER_PHASES)
    assert got["phases"]["other"] == 0.0 and got["wall_s"] == pytest.approx(1.6)


def test_stage_phases_reads_the_trainer_and_every_explorer(tmp_path: pathlib.Path) -> None:
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}"])
    run = pathlib.Path(cfg.run_dir)
    (run / "trainer").mkdir(parents=True)
    (run / "explorer").mkdir()
    (run / "trainer" / "progress.jsonl").write_text(
        json.dumps(trainer_step(5.0, read=1.0, step=3.0, update=3.0, optimizer=1.0)) + "\n"
    )
    for name, rollout in (("explorer", 2.0), ("explorer_1", 1.0)):
        record = {"step": 1, "time": 1.0, "metrics": {"time/rollout_s": rollout, "time/sync_s": 2.0}}
        (run / "explorer" / f"progress-{name}.jsonl").write_text(json.dumps(record) + "\n")

    phases = stage_phases(cfg)

    assert list(phases) == ["trainer", "explorer:explorer", "explorer:explorer_1"]
    assert phases["trainer"]["share"]["forward_backward"] == pytest.approx(0.5)  # 2 of 4 s
    assert phases["explorer:explorer_1"]["share"]["sync"] == pytest.approx(2 / 3, abs=1e-4)
    [line] = format_phases("grpo", {"trainer": phases["trainer"]})
    assert line == "grpo trainer (1 steps, 4.00 s/step): forward_backward 50% | wait_read 25% | optimizer 25%"


def test_peak_memory_is_the_highest_any_step_reported() -> None:
    records = [
        {"step": 1, "time": 1.0, "metrics": {"time/rollout_s": 1.0, "memory/peak_rss_mb": 1500.0}},
        {"step": 2, "time": 2.0, "metrics": {"time/rollout_s": 1.0, "memory/peak_rss_mb": 2048.0}},
        {"step": 3, "time": 3.0, "metrics": {"time/rollout_s": 1.0}},  # an older record: no figure
    ]
    got = breakdown(records, EXPLORER_PHASES)
    assert got["peak_rss_mb"] == 2048.0
    [line] = format_phases("grpo", {"explorer": got})
    assert line.startswith("grpo explorer (3 steps, 1.00 s/step, peak 2.0 GiB): rollout 100%")
    assert "peak_rss_mb" not in breakdown(records[2:], EXPLORER_PHASES)
