"""The explorer's files in the run directory: per-step progress records and eval results (JSON lines)."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def append_line(path: str, record: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")


def record_step(
    run_dir: str,
    explorer: str,
    step: int,
    metrics: dict[str, float],
    dropped: dict[str, int],
    partial: list[dict[str, Any]],
) -> None:
    """Append the step's timings to <run dir>/explorer/progress-<explorer>.jsonl (summary.json's
    phase breakdown, cli/phases.py), the experiences its pipeline dropped, by reason (summary.json's
    experiences.dropped, cli/stages.py), and its rows sampled by several versions (mid_step.py)."""
    record = {
        "time": time.time(),
        "step": step,
        "metrics": {k: v for k, v in metrics.items() if k.startswith(("time/", "memory/"))},
        "dropped": dropped,
        "partial": partial,
    }
    append_line(os.path.join(run_dir, "explorer", f"progress-{explorer}.jsonl"), record)


def record_eval(
    run_dir: str,
    head: dict[str, Any],
    scores: dict[str, float],
    eval_s: float,
    answers: list[dict[str, Any]],
) -> None:
    """Append to <run dir>/eval/results.jsonl (`trinity run` builds summary.json from it) and each
    sample's answer to eval/answers.jsonl. `head`: explorer, mode, step, model_version."""
    append_line(
        os.path.join(run_dir, "eval", "results.jsonl"),
        {"time": time.time(), **head, "eval_s": round(eval_s, 3), "scores": scores},
    )
    # each held-out answer beside its question, for `trinity view`'s before/after comparison
    with open(os.path.join(run_dir, "eval", "answers.jsonl"), "a") as fh:
        fh.writelines(json.dumps({**head, **a}, default=str) + "\n" for a in answers)
