"""The learning curve of a stage for summary.json: every eval of the run against training minutes.

Each record of `<run dir>/eval/results.jsonl` (the start- and end-of-stage evals of `trinity run`'s
bench explorer and the explorer's own evals every `eval_interval` steps) becomes a point:
`{"step", "model_version", "train_minutes", "scores"}` with the `mean@k` scores.

`train_minutes` counts the wall time the trainer was up, from its first start (its first `resumed`
event) to the moment the eval began, minus the time the explorer spent in the evals before it: the
minutes a run without evals would have needed to reach those weights. A run continued later
(`total_steps` raised, `continue_from_checkpoint`) starts the trainer again: each start opens a
session that ends at its last step record, and the wall time between sessions (the first run's
end-of-stage eval, the hours before the second `trinity run`; likewise a restart after a crash) is
not counted. The start-of-stage eval is at 0; the end-of-stage eval at the trainer's last step; a
later point never has fewer minutes than an earlier one (an eval overlapping the trainer's last
step is not subtracted twice). A run that trained nothing (bench, explore) has no `train_minutes`.
"""

from __future__ import annotations

import os
from typing import Any

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


def learning_curve(stage: TrinityConfig) -> list[dict[str, Any]]:
    """The stage's eval records in order, as curve points (see the module docstring)."""
    sessions = _trainer_sessions(stage)
    points, evals_before, latest = [], 0.0, 0.0
    for record in sorted(eval_records(stage), key=lambda r: float(r.get("time", 0.0))):
        scores = main_first(record.get("scores", {}))
        point: dict[str, Any] = {
            "step": int(record.get("step", 0)),
            "model_version": int(record.get("model_version", 0)),
            "scores": {k: round(v, 4) for k, v in scores.items() if "/mean@" in k},
        }
        if sessions:
            began = float(record.get("time", 0.0)) - float(record.get("eval_s", 0.0))
            latest = max(latest, _trained_seconds(sessions, began) - evals_before)
            point["train_minutes"] = round(latest / 60.0, 2)
            if any(start < began < end for start, end in sessions):  # the trainer mostly waited for it
                evals_before += float(record.get("eval_s", 0.0))
        points.append(point)
    return points
