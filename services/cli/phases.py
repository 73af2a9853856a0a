"""Where a run's time went: each service's step time split into phases, for summary.json and the end table.

The trainer's progress.jsonl and each explorer's `explorer/progress-<name>.jsonl` hold one record
per step with its `time/*` metrics and the wall-clock time it was written. A step's wall time is
the gap since the previous record of the same file (the first record: the sum of its phases);
`other` is what the named phases leave of it (checkpoint saves, logging, scheduling).

Trainer phases: `wait_read` (waiting for a batch and reading it: one blocking Read per request),
`prepare` (old/reference logprobs, values, advantages), `forward_backward`, `optimizer`,
`journal` (the replay journal), `ack`, `publish` (weights to the synchronizer).
Explorer phases: `read_tasks`, `sync` (waiting for and loading weights), `rollout` (generation and
reward of the whole task batch, with the groups written to the buffer meanwhile: streaming writes,
services/explorer/writes.py), `write` (what is written after a batch's last rollout: the groups
of a batch-level experience pipeline), `eval`.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Collection
from typing import Any

from services.common.config import TrinityConfig
from services.trainer.tally import read_lines

Metrics = dict[str, float]


def _get(m: Metrics, key: str) -> float:
    return float(m.get(key, 0.0))


TRAINER_PHASES: dict[str, Callable[[Metrics], float]] = {
    "wait_read": lambda m: _get(m, "time/read"),
    "prepare": lambda m: max(_get(m, "time/step") - _get(m, "time/update"), 0.0),
    "forward_backward": lambda m: max(_get(m, "time/update") - _get(m, "time/optimizer"), 0.0),
    "optimizer": lambda m: _get(m, "time/optimizer"),
    "journal": lambda m: _get(m, "time/replay_journal"),
    "ack": lambda m: _get(m, "time/ack"),
    "publish": lambda m: _get(m, "time/publish"),
}
EXPLORER_PHASES: dict[str, Callable[[Metrics], float]] = {
    "read_tasks": lambda m: _get(m, "time/read_tasks_s"),
    "sync": lambda m: _get(m, "time/sync_s"),
    "rollout": lambda m: _get(m, "time/rollout_s"),
    "write": lambda m: _get(m, "time/write_s"),
    "eval": lambda m: _get(m, "time/eval_s"),
}


def breakdown(records: list[dict[str, Any]], phases: dict[str, Callable[[Metrics], float]]) -> dict[str, Any]:
    """{"steps", "wall_s", "phases": {name: seconds}, "share": {name: fraction of wall_s}}, plus
    "peak_rss_mb" (the service's peak resident memory) where its records carry it."""
    totals = dict.fromkeys([*phases, "other"], 0.0)
    wall, previous, peak = 0.0, None, 0.0
    for record in records:
        metrics = record.get("metrics", {})
        peak = max(peak, _get(metrics, "memory/peak_rss_mb"))
        parts = {name: fn(metrics) for name, fn in phases.items()}
        named = sum(parts.values())
        now = float(record.get("time", 0.0))
        step_wall = max(now - previous, named) if previous is not None else named
        previous = now
        for name, seconds in parts.items():
            totals[name] += seconds
        totals["other"] += step_wall - named
        wall += step_wall
    out: dict[str, Any] = {
        "steps": len(records),
        "wall_s": round(wall, 3),
        "phases": {k: round(v, 3) for k, v in totals.items()},
        "share": {k: round(v / wall, 4) if wall > 0 else 0.0 for k, v in totals.items()},
    }
    if peak > 0:
        out["peak_rss_mb"] = round(peak, 1)
    return out


def _steps(path: str) -> list[dict[str, Any]]:
    return [r for r in read_lines(path) if r is not None and "step" in r and "metrics" in r]


def stage_phases(stage: TrinityConfig, workers: Collection[str] = ("trainer", "explorer")) -> dict[str, Any]:
    """The breakdown of the trainer and of each explorer of a stage (a service with no steps is left out).

    Only the `workers` this run started count: a run dir may hold an earlier run's files (train, then
    explore on the same run)."""
    out: dict[str, Any] = {}
    trainer = _steps(os.path.join(stage.run_dir, "trainer", "progress.jsonl")) if "trainer" in workers else []
    if trainer:
        out["trainer"] = breakdown(trainer, TRAINER_PHASES)
    explorer_files = glob.glob(os.path.join(stage.run_dir, "explorer", "progress-*.jsonl"))
    for path in sorted(explorer_files) if "explorer" in workers else []:
        records = _steps(path)
        if records:
            name = os.path.basename(path).removeprefix("progress-").removesuffix(".jsonl")
            out[f"explorer:{name}"] = breakdown(records, EXPLORER_PHASES)
    return out


def format_phases(stage_name: str, phases: dict[str, Any]) -> list[str]:
    """`grpo trainer (60 steps, 0.41 s/step): forward_backward 52% | wait_read 31% | ...` per service."""
    lines = []
    for service, b in phases.items():
        if not b["steps"]:
            continue
        ranked = sorted(b["share"].items(), key=lambda kv: -kv[1])
        parts = " | ".join(f"{name} {share:.0%}" for name, share in ranked if share >= 0.005)
        memory = f", peak {b['peak_rss_mb'] / 1024:.1f} GiB" if "peak_rss_mb" in b else ""
        lines.append(
            f"{stage_name} {service} ({b['steps']} steps, {b['wall_s'] / b['steps']:.2f} s/step{memory}): {parts}"
        )
    return lines
