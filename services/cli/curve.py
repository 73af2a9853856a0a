"""The learning curve of a stage for summary.json: every eval of the run against training minutes.

Each record of `<run dir>/eval/results.jsonl` (the start- and end-of-stage evals of `trinity run`'s
bench explorer and the explorer's own evals every `eval_interval` steps) becomes a point:
`{"step", "model_version", "train_minutes", "scores"}` with the `mean@k` scores.

`train_minutes` counts the wall time the trainer was up, from its first start (its first `resumed`
event) to the moment the eval began, minus the time the trainer sat waiting for a batch while an
eval before it ran (its waits are in its step records: `time/read`, ending where the step's own work
began). A trainer that waits for the explorer through an eval has the eval's time left out; one
that trains on through it (fully asynchronous, with rows buffered; or on the batch written just
before the eval) has nothing left out. That makes it an upper bound on the minutes a run without
evals would have needed to reach those weights: an eval that slows the trainer (both on the same
cores), or delays the batch after it, still counts. A run continued later (`total_steps` raised,
`continue_from_checkpoint`) starts the trainer again: each start opens a session that ends at its
last step record, and the wall time between sessions (the first run's end-of-stage eval, the hours
before the second `trinity run`; likewise a restart after a crash) is not counted. The start-of-stage eval is at 0; the end-of-stage eval at the
trainer's last step; a later point never has fewer minutes than an earlier one. A run that trained
nothing (bench, explore) has no `train_minutes`.
"""

from __future__ import annotations

import os
from typing import Any

from services.cli.phases import TRAINER_PHASES
from services.cli.stages import eval_records, main_first
from services.common.config import TrinityConfig
from services.trainer.tally import read_lines


def _trainer_sessions(stage: TrinityConfig) -> list[tuple[float, float]]:
    """(start, last step record) wall times of each start of the stage's trainer that stepped."""
    trainer = os.path.join(stage.run_dir, "trainer")
    starts = sorted(
        float(e["time"])
        for e in read_lines(os.path.join(trainer, "events.jsonl"))
        if e is not None and e.get("event") == "resumed" and "time" in e
    )
    steps = sorted(
        float(r["time"]) for r in read_lines(os.path.join(trainer, "progress.jsonl")) if r and "time" in r
    )
    sessions = []
    for i, start in enumerate(starts):
        until = starts[i + 1] if i + 1 < len(starts) else float("inf")
        mine = [t for t in steps if start <= t < until]
        if mine:
            sessions.append((start, mine[-1]))
    return sessions


def _trained_seconds(sessions: list[tuple[float, float]], at: float) -> float:
    """Seconds the trainer was up in its sessions before wall time `at`."""
    return sum(max(0.0, min(at, end) - start) for start, end in sessions)


def _trainer_waits(stage: TrinityConfig) -> list[tuple[float, float]]:
    """(start, end) wall times of the trainer's waits for a batch, from its step records: a step
    reads first (`wait_read`), then runs its other phases (cli/phases.py) until its record's time."""
    waits = []
    for record in read_lines(os.path.join(stage.run_dir, "trainer", "progress.jsonl")):
        metrics = (record or {}).get("metrics") or {}
        wait = TRAINER_PHASES["wait_read"](metrics)
        if record and "time" in record and wait > 0:
            work = sum(fn(metrics) for name, fn in TRAINER_PHASES.items() if name != "wait_read")
            end = float(record["time"]) - work
            waits.append((end - wait, end))
    return waits


def _overlap(waits: list[tuple[float, float]], evals: list[tuple[float, float]], until: float) -> float:
    """Seconds before `until` that lie in a wait and in an eval (the waits never overlap each other)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(evals):  # evals of two explorers may overlap: count their union once
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return sum(
        max(0.0, min(w_end, e_end, until) - max(w_start, e_start))
        for w_start, w_end in waits
        for e_start, e_end in merged
    )


def learning_curve(stage: TrinityConfig) -> list[dict[str, Any]]:
    """The stage's eval records in order, as curve points (see the module docstring)."""
    sessions, waits = _trainer_sessions(stage), _trainer_waits(stage)
    points, latest = [], 0.0
    evals: list[tuple[float, float]] = []
    for record in sorted(eval_records(stage), key=lambda r: float(r.get("time", 0.0))):
        scores = main_first(record.get("scores", {}))
        point: dict[str, Any] = {
            "step": int(record.get("step", 0)),
            "model_version": int(record.get("model_version", 0)),
            "scores": {k: round(v, 4) for k, v in scores.items() if "/mean@" in k},
        }
        began = float(record.get("time", 0.0)) - float(record.get("eval_s", 0.0))
        if sessions:
            idle = _overlap(waits, evals, began)  # waiting for a batch while an earlier eval ran
            latest = max(latest, _trained_seconds(sessions, began) - idle)
            point["train_minutes"] = round(latest / 60.0, 2)
        evals.append((began, float(record.get("time", 0.0))))
        points.append(point)
    return points
