"""What the pages read: the run (re-read while it is live), the index, tokenizers, the learning
curve, the services' health, progress figures. One Viewer per `trinity view`; thread-safe."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import TrinityError
from services.view.detail import Advantages
from services.view.index import ExperienceIndex, SyncReport
from services.view.run_dir import Run, Stage, open_run
from services.view.tokens import Decoders

# Seconds a services probe is reused: the overview polls every few seconds.
HEALTH_TTL_S = 5.0


@dataclass
class Progress:
    """Where a stage stands, from its progress files and the index."""

    trainer_step: int | None = None
    total_steps: int | None = None
    trainer_metrics: dict[str, float] = field(default_factory=dict)
    trainer_steps_per_min: float | None = None
    explorer_steps: dict[str, int] = field(default_factory=dict)
    explorer_step_s: dict[str, float] = field(default_factory=dict)
    newest_version: int | None = None
    rows: int = 0
    rows_trained: int = 0
    rows_per_min: float | None = None

    @property
    def version_lag(self) -> int | None:
        """Trainer step minus the model version of the newest experience."""
        if self.trainer_step is None or self.newest_version is None:
            return None
        return self.trainer_step - self.newest_version


def _per_minute(times: list[float], count: int) -> float | None:
    return count / (times[-1] - times[0]) * 60 if len(times) > 1 and times[-1] > times[0] else None


class Viewer:
    def __init__(
        self,
        run_dir: str | None = None,
        *,
        config: str | None = None,
        index_path: str | pathlib.Path | None = None,
        tokenizer: str | None = None,
        health_timeout: float = 1.0,
    ) -> None:
        self._args = (run_dir, config)
        self._run = open_run(run_dir, config)
        if not self._run.stages:
            raise TrinityError(f"{self._run.root}: no stages found")
        self.index = ExperienceIndex(index_path or self._run.root / "view" / "index.sqlite")
        self.decoders = Decoders(tokenizer)
        self.advantages = Advantages()
        self.health_timeout = health_timeout
        self.last_sync: float | None = None
        self.last_report = SyncReport()
        self._lock = threading.Lock()
        self._curves: dict[str, tuple[tuple[Any, ...], Any]] = {}
        self._health: dict[str, tuple[float, Any]] = {}

    @property
    def run(self) -> Run:
        return self._run

    def refresh(self) -> SyncReport:
        """Re-read the run directory (a live run adds stages) and bring the index up to date."""
        run = open_run(*self._args)
        with self._lock:
            self._run = run
        report = self.index.sync(run)
        self.last_sync, self.last_report = time.time(), report
        return report

    @contextlib.contextmanager
    def reader(self) -> Iterator[sqlite3.Connection]:
        conn = self.index.reader()
        try:
            yield conn
        finally:
            conn.close()

    def default_stage(self) -> str:
        """The last stage with experiences in the index, else the last stage."""
        with self.reader() as conn:
            have = {r[0] for r in conn.execute("SELECT DISTINCT stage FROM rows INDEXED BY ix_rows_stage")}
        named = [s.name for s in self.run.stages]
        return next((n for n in reversed(named) if n in have), named[-1])

    # ---- files -----------------------------------------------------------------------------------
    def curve(self, stage: Stage) -> Any:
        """`trinity plot`'s series of the stage (services/cli/plot.py read_run), or why there is none.
        Re-read only when an event file changed."""
        from services.cli.plot import read_run

        root = stage.path / "monitor" / "tensorboard"
        files = sorted(root.rglob("events.out.tfevents.*")) if root.is_dir() else []
        signature = tuple((str(f), f.stat().st_size) for f in files)
        cached = self._curves.get(stage.name)
        if cached is not None and cached[0] == signature:
            return cached[1]
        try:
            value: Any = read_run(stage.path)
        except TrinityError as exc:
            value = str(exc)
        self._curves[stage.name] = (signature, value)
        return value

    def services(self, stage: Stage) -> list[Any] | None:
        """`trinity status`'s rows for a stage whose services run (or the --config run), else None."""
        if stage.cfg is None or not (self.run.from_config or stage.live_pids()):
            return None
        cached = self._health.get(stage.name)
        if cached is not None and time.time() - cached[0] < HEALTH_TTL_S:
            return list(cached[1])
        from services.cli.status import service_rows

        rows = asyncio.run(service_rows(stage.cfg, timeout=self.health_timeout))
        self._health[stage.name] = (time.time(), rows)
        return rows

    def progress(self, stage: Stage) -> Progress:
        out = Progress(total_steps=stage.total_steps)
        trainer = stage.trainer_tail(20)
        if trainer:
            out.trainer_step = int(trainer[-1]["step"])
            out.trainer_metrics = {k: float(v) for k, v in trainer[-1].get("metrics", {}).items()}
            out.trainer_steps_per_min = _per_minute(
                [float(r.get("time", 0)) for r in trainer], len(trainer) - 1
            )
        for name, records in stage.explorer_tails(20).items():
            if records:
                out.explorer_steps[name] = int(records[-1]["step"])
                steps = [float(r.get("metrics", {}).get("time/step_s", 0.0)) for r in records]
                out.explorer_step_s[name] = sum(steps) / len(steps)
        with self.reader() as conn:
            first = conn.execute(
                "SELECT created_at FROM rows INDEXED BY ix_rows_stage WHERE stage = ? ORDER BY id LIMIT 1",
                (stage.name,),
            ).fetchone()
            last = conn.execute(
                "SELECT created_at, model_version FROM rows INDEXED BY ix_rows_stage WHERE stage = ? "
                "ORDER BY id DESC LIMIT 1",
                (stage.name,),
            ).fetchone()
            out.rows = int(
                conn.execute(
                    "SELECT count(*) FROM rows INDEXED BY ix_rows_stage WHERE stage = ?", (stage.name,)
                ).fetchone()[0]
            )
            out.rows_trained = int(
                conn.execute(
                    "SELECT count(*) FROM rows INDEXED BY ix_rows_stage WHERE stage = ? AND trained_step IS NOT NULL",
                    (stage.name,),
                ).fetchone()[0]
            )
        if last is not None:
            out.newest_version = int(last[1])
            out.rows_per_min = _per_minute([float(first[0]), float(last[0])], out.rows - 1)
        return out
