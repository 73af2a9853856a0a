"""The trainer's run loop: read leased batches → train → ack → publish → save. gRPC-free.

Ordering is the crash-safety contract:
  1. the rows of a step are read under leases (never acked before training);
  2. the optimizer step is applied;
  3. the leases are acked — from now on the buffer never hands those rows out again;
  4. the new weights are published when the sync plan says so;
  5. every `save_interval` steps (and at the end) a full checkpoint is written atomically.
A SIGKILL between 1 and 3 leaves the rows leased: the restarted trainer nacks them first (leases.py:
the leases it journaled, and by reader id those whose Read reply it died before journaling),
so the buffer hands them out again at once instead of after `buffer.lease_s` (they were never
acked, and the weights that saw them were never saved). Between 2 and 3 the step's rows are
journaled on the trainer's disk (replay.py) until a checkpoint holds their update. A SIGKILL after 3
loses the optimizer steps since the last checkpoint, not their data: the restarted trainer resumes
the weights, optimizer, schedule and step of the latest checkpoint, numbers its next step after the
newest version it had published (see _skip_published_steps), trains the journaled rows of the lost
steps again, and reads on from the buffer. Every start appends a `resumed` record to events.jsonl
(beside progress.jsonl) so that `trinity run`'s counters drop the lost steps' records (cli/tally.py).

The source, sink and records it works with live in ports.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from services.common.config.schema import TrinityConfig
from services.common.logging import get_logger
from services.common.monitor import Monitor, NullMonitor, peak_rss_mb
from services.trainer.batching import build_batch, untrainable_reason
from services.trainer.checkpoint import DataCursor, TrainerState, full_checkpoint_root, save_checkpoint
from services.trainer.engine import StepAbandoned, TrainEngine
from services.trainer.leases import LeaseJournal
from services.trainer.ports import (
    Collected,
    ExperienceSource,
    NullSink,
    Status,
    WeightSink,
    experience_key,
    max_model_length,
)
from services.trainer.reading import LeasedReader
from services.trainer.replay import ReplayEntry, ReplayJournal
from services.trainer.tally import tally_dir

log = get_logger("trainer")


class TrainerLoop:
    """See the module docstring. `run()` returns when total_steps are done or the data ended."""

    def __init__(
        self,
        cfg: TrinityConfig,
        engine: TrainEngine,
        tokenizer: Any,
        source: ExperienceSource,
        *,
        sink: WeightSink | None = None,
        monitor: Monitor | None = None,
        state: TrainerState | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.tokenizer = tokenizer
        self.source = source
        self.sink = sink or NullSink()
        self.monitor = monitor or NullMonitor()
        self.cursor = state.cursor if state else DataCursor()
        self.status = Status(step=engine.step, model_version=state.model_version if state else 0)
        self.checkpoint_root = full_checkpoint_root(cfg.run_dir)
        self.progress_path = os.path.join(cfg.run_dir, "trainer", "progress.jsonl")
        self.leases = LeaseJournal(cfg.run_dir, cfg.trainer.name)
        self.replay = ReplayJournal(cfg.run_dir, cfg.trainer.name, enabled=cfg.trainer.replay_lost_updates)
        self._stop = asyncio.Event()
        self.reader = LeasedReader(cfg, source, self.leases, self._stop, self.status)
        self._lock = asyncio.Lock()  # one of: a training step, a checkpoint save
        self._saved_step = engine.step if state else -1
        self.last_save_s = 0.0  # how long the last checkpoint took to write (a stop keeps time for one)
        self._max_length = max_model_length(cfg, engine.model)
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = int(pad) if pad is not None else 0

    # ---- control --------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the step in progress (or abandon a read), save, and return from run()."""
        self._stop.set()

    def abandon_step(self) -> None:
        """Give up the step in progress at its next micro-batch, before its optimizer step: its rows
        go back to the buffer untrained (a stop that cannot wait for the step to finish)."""
        event = getattr(self.engine, "abandon", None)
        if event is not None:
            event.set()

    @property
    def total_steps(self) -> int | None:
        return self.cfg.trainer.total_steps or self.cfg.buffer.total_steps

    def _finished(self) -> bool:
        return self._stop.is_set() or (self.total_steps is not None and self.engine.step >= self.total_steps)

    # ---- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        log.info(
            "trainer_started",
            step=self.engine.step,
            total_steps=self.total_steps,
            algorithm=self.engine.algorithm.name,
        )
        checkpoint_step = self.engine.step
        pending = self.replay.resume(checkpoint_step)
        await self.leases.return_previous(
            self.source,
            reader_id=self.cfg.trainer.name,
            buffers=self.reader.input_buffers(),
            checkpoint_step=checkpoint_step,
            replayed={lease for entry in pending for lease in entry.leases},
        )
        self._skip_published_steps()
        self._append_event(
            {
                "event": "resumed",
                "at_line": _line_count(self.progress_path),
                "time": time.time(),
                "checkpoint_step": checkpoint_step,
                "next_step": self.engine.step + 1,
                "replay": self.replay.enabled,
                "replaying_steps": [entry.step for entry in pending],
            }
        )
        if self.engine.step > 0 and hasattr(self.sink, "publish_resumed"):
            if await self.sink.publish_resumed(self.engine.step, self.engine):
                self.status.model_version = self.engine.step
        lost = tally_dir(os.path.dirname(self.progress_path))
        self.status.updates_lost = lost.updates_lost
        self.status.rows_update_lost = lost.dropped.get("update_lost", 0)
        if lost.updates_lost:
            log.warning(
                "updates_lost_in_crashes",
                updates_lost=lost.updates_lost,
                rows=self.status.rows_update_lost,
                hint="trainer.replay_lost_updates: true trains them again",
            )
        try:
            await self._replay(pending)
            while not self._finished():
                step = self.engine.step + 1
                await self.sink.begin_step(step)
                t_read = time.perf_counter()
                self.status.state = "reading"
                got = await self._collect(step)
                if got is None:
                    break
                read_s = time.perf_counter() - t_read
                if not got.experiences:
                    log.info("end_of_data", step=self.engine.step)
                    break
                await self._train(step, got, read_s)
                if got.end_of_data:
                    break
        finally:
            self.status.state = "saving"
            if self.engine.step > max(self._saved_step, 0):
                await self.save()
            await self.sink.close()
            self.monitor.close()
            self.status.state = "done"
        log.info("trainer_done", step=self.engine.step, samples=self.cursor.samples)

    async def _replay(self, pending: list[ReplayEntry]) -> None:
        """Train the journaled rows of the steps a crash lost again, each as a new step."""
        for done, entry in enumerate(pending):
            if self._finished():
                if not self._stop.is_set():  # total_steps reached first: these rows stay untrained
                    rows = [experience_key(e) for p in pending[done:] for e in p.experiences]
                    log.warning("replay_skipped_total_steps_reached", rows=len(rows))
                    self._append_event({"event": "replay_skipped", "time": time.time(), "rows": rows})
                    for skipped in pending[done:]:
                        self.replay.done(skipped)
                return  # stopped: the pending files wait for the next start
            step = self.engine.step + 1
            await self.sink.begin_step(step)
            got = Collected(
                experiences=entry.experiences, is_expert=entry.is_expert, per_buffer=entry.per_buffer
            )
            await self._train(step, got, 0.0, replaces=entry.path)
            self.replay.done(entry)
            self.status.steps_replayed += 1
            log.info("lost_update_replayed", step=step, lost_step=entry.step, rows=len(entry.experiences))

    def _drop_untrainable(self, got: Collected) -> list[str]:
        """Remove rows no step can use (no tokens, too long...) so they cannot crash-loop the trainer.

        They are acked with the rest (re-reading them would fail the same way) and logged with why;
        returns their keys.
        """
        keep_rows, keep_expert, dropped = [], [], []
        for exp, expert in zip(got.experiences, got.is_expert, strict=True):
            reason = untrainable_reason(exp, self._max_length)
            if reason is None:
                keep_rows.append(exp)
                keep_expert.append(expert)
            else:
                dropped.append(experience_key(exp))
                log.error("row_dropped", row=dropped[-1], field=reason[0], reason=reason[1])
        got.experiences, got.is_expert = keep_rows, keep_expert
        return dropped

    async def _train(self, step: int, got: Collected, read_s: float, replaces: str = "") -> None:
        async with self._lock:
            self.status.state = "training"
            dropped = self._drop_untrainable(got)
            if dropped:
                self._append_event(
                    {"event": "dropped", "time": time.time(), "reason": "untrainable", "rows": dropped}
                )
            if not got.experiences:  # nothing usable: consume the leases, the step does not count
                for lease in got.leases:
                    await self.reader.ack(lease)
                return
            batch = build_batch(
                got.experiences,
                pad_token_id=self._pad_id,
                is_expert=got.is_expert,
                max_length=self._max_length,
            )
            version_before = self.engine.step
            t0 = time.perf_counter()
            try:
                metrics = await asyncio.to_thread(self.engine.train_step, batch)
            except StepAbandoned:
                for lease in got.leases:
                    await self.reader.give_back(lease)
                log.warning("step_abandoned", step=step, rows=len(got.experiences), hint="rows given back")
                return
            train_s = time.perf_counter() - t0
            t_journal = time.perf_counter()
            metrics["replay/bytes"] = float(
                self.replay.record(
                    self.engine.step, got.experiences, got.is_expert, got.leases, got.per_buffer, replaces
                )
            )
            metrics["time/replay_journal"] = time.perf_counter() - t_journal
            self.leases.trained(got.leases, self.engine.step)
            t1 = time.perf_counter()
            for lease in got.leases:
                await self.reader.ack(lease)
            metrics["time/ack"] = time.perf_counter() - t1
            self._advance_cursor(got, metrics)
            t2 = time.perf_counter()
            with self.engine.peaks.phase("publish"):
                published = await self.sink.end_step(step, self.engine)
            metrics.update(self.engine.peaks.metrics())
            if published:
                self.status.model_version = step
            metrics["time/publish"] = time.perf_counter() - t2
            metrics["time/read"] = read_s
            metrics["batch/dropped_rows"] = float(len(dropped))
            metrics["perf/tokens_per_s"] = metrics["batch/tokens"] / max(train_s, 1e-9)
            metrics["memory/peak_rss_mb"] = peak_rss_mb()
            versions = [e.model_version for e in got.experiences]
            metrics["staleness/mean"] = version_before - sum(versions) / len(versions)
            metrics["staleness/max"] = float(version_before - min(versions))
            self._report(step, metrics, got, replayed=bool(replaces))
            if step % self.cfg.trainer.save_interval == 0:
                await self._save_locked()

    async def _collect(self, step: int) -> Collected | None:
        """Read every request of the sample strategy's plan; None when asked to stop meanwhile."""
        plan = self.engine.algorithm.sample_strategy.plan(
            train_batch_size=self.cfg.train_batch_size, model_version=self.engine.step
        )
        return await self.reader.collect(plan, step)

    def _skip_published_steps(self) -> None:
        """Resumed from a checkpoint older than the newest published version: continue after it.

        The versions the steps since the checkpoint made are in the explorers' hands, so those steps
        can be neither re-numbered (a version number names one set of weights) nor replayed under
        their old numbers (explorers wait for versions after the newest: a deadlock). The trainer
        numbers its next step after the newest published version; the journaled rows of the lost
        steps are trained again as new steps (replay.py), or, with trainer.replay_lost_updates off,
        their updates are lost.
        """
        latest = int(getattr(self.sink, "latest_version", 0) or 0)
        if latest > self.engine.step:
            log.warning(
                "steps_lost_in_crash",
                checkpoint_step=self.engine.step,
                latest_version=latest,
                lost_updates=latest - self.engine.step,
                next_step=latest + 1,
                replayed=self.replay.enabled,
            )
            self.engine.step = latest
            self.status.step = latest

    # ---- bookkeeping ----------------------------------------------------------------------------

    def _advance_cursor(self, got: Collected, metrics: dict[str, float]) -> None:
        self.cursor.batches += 1
        self.cursor.samples += len(got.experiences)
        self.cursor.tokens += int(metrics.get("batch/tokens", 0))
        for name, n in got.per_buffer.items():
            self.cursor.per_buffer[name] = self.cursor.per_buffer.get(name, 0) + n

    def _report(self, step: int, metrics: dict[str, float], got: Collected, *, replayed: bool) -> None:
        self.status.step = step
        self.status.loss = metrics.get("actor/loss", float("nan"))
        self.status.tokens_per_s = metrics["perf/tokens_per_s"]
        self.monitor.log(metrics, step)
        log.info(
            "train_step",
            step=step,
            loss=round(self.status.loss, 6),
            reward=round(metrics.get("critic/rewards/mean", 0.0), 4),
            tokens_per_s=round(metrics["perf/tokens_per_s"], 1),
            grad_norm=round(metrics["actor/grad_norm"], 4),
            lr=metrics["actor/lr"],
            staleness=metrics["staleness/mean"],
            rows=len(got.experiences),
            peak_mb={
                k.removeprefix("memory/").removesuffix("_peak_mb"): v
                for k, v in metrics.items()
                if k.startswith("memory/") and k.endswith("_peak_mb")
            },
        )
        record: dict[str, Any] = {
            "step": step,
            "time": time.time(),
            "metrics": metrics,
            "rows": [experience_key(e) for e in got.experiences],
        }
        if replayed:
            record["replayed"] = True
        self._append_progress(record)

    def _append_progress(self, record: dict[str, Any]) -> None:
        os.makedirs(os.path.dirname(self.progress_path), exist_ok=True)
        with open(self.progress_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def _append_event(self, record: dict[str, Any]) -> None:
        path = os.path.join(os.path.dirname(self.progress_path), "events.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    # ---- checkpoints ----------------------------------------------------------------------------

    async def save(self) -> tuple[str, int]:
        """Save a full checkpoint of the current step (waits for a step in progress to finish)."""
        async with self._lock:
            return await self._save_locked()

    async def _save_locked(self) -> tuple[str, int]:
        state = TrainerState(
            step=self.engine.step, model_version=self.status.model_version, cursor=self.cursor
        )

        def gather_and_write() -> Any:  # gathering is a collective under FSDP: off the event loop
            model_state, engine_state = self.engine.full_model_state(), self.engine.state_dict()
            return save_checkpoint(
                self.checkpoint_root,
                state,
                model=self.engine.model,
                tokenizer=self.tokenizer,
                engine_state=engine_state,
                model_state=model_state,
                keep=self.cfg.trainer.effective_checkpoints_to_keep,
            )

        started = time.perf_counter()
        path = await asyncio.to_thread(gather_and_write)
        self.last_save_s = time.perf_counter() - started
        self._saved_step = self.engine.step
        self.replay.checkpointed(self.engine.step)
        self.status.last_checkpoint = str(path)
        log.info("checkpoint_saved", step=self.engine.step, path=str(path))
        return str(path), self.engine.step


def _line_count(path: str) -> int:
    try:
        with open(path, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0
