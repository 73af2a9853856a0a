"""What the trainer's progress files say about a run's rows: trained, dropped (and why), lost.

progress.jsonl holds one record per step (`step`, `rows`, `metrics`; `replayed: true` for a step
that trained a crash-lost step's journaled rows again). events.jsonl beside it holds:
- `resumed` (every trainer start; `at_line`: progress.jsonl's line count then): the step records
  before that line of steps after its `checkpoint_step` are not in the weights any more. With
  `replay: true` their rows are trained again by later `replayed` records; with `replay: false`
  their updates are lost and their rows count as dropped (`update_lost`).
- `dropped` (`reason`, `rows`): rows no step could use, acked without training.
- `replay_skipped` (`rows`): journaled rows that total_steps left no step to train again.

So written = trained + buffered + sum(dropped) holds across any crash and re-run.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tally:
    steps: int = 0
    trained: int = 0
    tokens: int = 0  # tokens of the trained rows (prompt + response)
    rewards: list[float] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    updates_lost: int = 0  # optimizer steps a crash discarded and nothing trained again
    awaiting_replay: int = 0  # rows of lost steps not yet trained again (the run is not finished)

    def drop(self, reason: str, n: int) -> None:
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n


def tally(progress: list[dict[str, Any] | None], events: list[dict[str, Any]]) -> Tally:
    """`progress`: progress.jsonl's lines in order (None for a line that did not parse)."""
    out = Tally()
    live: list[dict[str, Any]] = []  # step records whose update is in the weights
    awaiting: Counter[str] = Counter()
    resumes = sorted(
        (e for e in events if e.get("event") == "resumed"), key=lambda e: int(e.get("at_line", 0))
    )
    for at in range(len(progress) + 1):
        while resumes and int(resumes[0].get("at_line", 0)) <= at:
            resumed = resumes.pop(0)
            checkpoint = int(resumed.get("checkpoint_step", 0))
            lost = [r for r in live if int(r["step"]) > checkpoint]
            live = [r for r in live if int(r["step"]) <= checkpoint]
            if resumed.get("replay", False):
                awaiting.update(row for r in lost for row in r["rows"])
            else:
                out.updates_lost += len(lost)
                out.drop("update_lost", sum(len(r["rows"]) for r in lost))
        record = progress[at] if at < len(progress) else None
        if record is None or "step" not in record:
            continue
        out.steps = max(out.steps, int(record["step"]))  # version numbers never go back
        live.append(record)
        if record.get("replayed"):
            awaiting.subtract(record["rows"])
    for event in events:
        if event.get("event") == "dropped":
            out.drop(str(event.get("reason", "unknown")), len(event.get("rows", [])))
        elif event.get("event") == "replay_skipped":
            rows = event.get("rows", [])
            awaiting.subtract(rows)
            out.drop("replay_skipped", len(rows))
    for record in live:
        out.trained += len(record["rows"])
        out.tokens += int(record["metrics"].get("batch/tokens", 0))
        out.rewards.append(float(record["metrics"].get("critic/rewards/mean", float("nan"))))
    out.awaiting_replay = sum(n for n in awaiting.values() if n > 0)
    return out


def read_lines(path: str) -> list[dict[str, Any] | None]:
    """A JSON-lines file's records in order; None for a line a killed writer left half-written."""
    records: list[dict[str, Any] | None] = []
    try:
        with open(path) as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                records.append(record if isinstance(record, dict) else None)
    except OSError:
        return []
    return records


def tally_dir(trainer_dir: str) -> Tally:
    """The tally of `<run dir>/trainer`."""
    events = [e for e in read_lines(os.path.join(trainer_dir, "events.jsonl")) if e is not None]
    return tally(read_lines(os.path.join(trainer_dir, "progress.jsonl")), events)
