"""The learning curve of a stage for summary.json: every eval of the run against training minutes.

Each record of `<run dir>/eval/results.jsonl` (the start- and end-of-stage evals of `trinity run`'s
bench explorer and the explorer's own evals every `eval_interval` steps) becomes a point:
`{"step", "model_version", "train_minutes", "scores"}` with the `mean@k` scores.

`train_minutes` counts wall time from the trainer's first start (its first `resumed` event) to the
moment the eval began, minus the time the explorer spent in the evals before it: the minutes a run
without evals would have needed to reach those weights. The start-of-stage eval is at 0; the
end-of-stage eval at the trainer's last step; a later point never has fewer minutes than an
earlier one (an eval overlapping the trainer's last step is not subtracted twice). A run that
trained nothing (bench, explore) has no `train_minutes`.
"""

from __future__ import annotations

import os
from typing import Any

from services.cli.stages import eval_records, main_first
from services.common.config import TrinityConfig
from services.trainer.tally import read_lines


def _trainer_span(stage: TrinityConfig) -> tuple[float, float] | None:
    """(first start, last step record) wall times of the stage's trainer, if it trained."""
    trainer = os.path.join(stage.run_dir, "trainer")
    starts = [
        float(e["time"])
        for e in read_lines(os.path.join(trainer, "events.jsonl"))
        if e is not None and e.get("event") == "resumed" and "time" in e
    ]
    steps = [
        float(r["time"]) for r in read_lines(os.path.join(trainer, "progress.jsonl")) if r and "time" in r
    ]
    if not starts or not steps:
        return None
    return min(starts), max(steps)


def learning_curve(stage: TrinityConfig) -> list[dict[str, Any]]:
    """The stage's eval records in order, as curve points (see the module docstring)."""
    span = _trainer_span(stage)
    points, evals_before, latest = [], 0.0, 0.0
    for record in sorted(eval_records(stage), key=lambda r: float(r.get("time", 0.0))):
        scores = main_first(record.get("scores", {}))
        point: dict[str, Any] = {
            "step": int(record.get("step", 0)),
            "model_version": int(record.get("model_version", 0)),
            "scores": {k: round(v, 4) for k, v in scores.items() if "/mean@" in k},
        }
        if span is not None:
            first, last = span
            began = float(record.get("time", 0.0)) - float(record.get("eval_s", 0.0))
            seconds = 0.0 if began <= first else min(began, last) - first - evals_before
            latest = max(latest, seconds)
            point["train_minutes"] = round(latest / 60.0, 2)
            if first < began < last:  # an eval inside the run took time the trainer mostly waited
                evals_before += float(record.get("eval_s", 0.0))
        points.append(point)
    return points
