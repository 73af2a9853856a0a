"""Taskset: tasks from a file, handed out in batches under a persisted per-reader cursor.

Epochs: a training taskset drops the last partial batch of an epoch (every batch has exactly
`batch_size` tasks); an eval taskset keeps it. The taskset ends after `total_epochs`, or after
`total_steps` batches when that is set (then epochs repeat as needed). The cursor (epoch,
offset in the epoch, batch index) is committed before the batch is returned, so a restarted
explorer continues at the next unread batch.

`extend` hands a reader more tasks for the batch it was last handed: the next tasks after its
cursor under the same batch index (dynamic sampling's refill, which must not count as a step).
Only the cursor moves; the one kept for `repeat_last` stays at the batch's start, so a restarted
explorer that repeats the batch reads the same extensions after it again (for the seeded
selectors: random and difficulty_based seed an extension with (seed, batch index, tasks read)).

Selectors (Trinity's `task_selector.selector_type`):
- sequential: file order every epoch;
- offline_easy2hard: the order of the feature_keys columns, highest (easiest) first, every epoch;
- shuffle: a permutation per epoch, seeded with seed + epoch (the same after a restart);
- random: sampling with replacement, seeded with seed + batch_index;
- difficulty_based: sampling without replacement with weight exp(-|pass_rate - target| / temperature)
  from the pass rates reported by ReportTaskFeedback; tasks without feedback count as being at
  the target, so unseen tasks are explored first;
- difficulty_based with feature_keys: Trinity's BOTS estimator (bots.py), fed by the same
  reports, choosing from the whole taskset each batch with seed + tasks read by the reader. Its
  state is stored with the feedback in one transaction, so a restarted buffer keeps it (Trinity
  keeps only its read position and starts the estimator over).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from services.buffer.kinds import bots
from services.buffer.storage import schema as s
from services.buffer.storage.engine import Database
from services.buffer.taskfile import task_id_of
from services.buffer.types import TaskBatch
from services.common.config.buffer import BotsConfig
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.experience import Task
from services.common.logging import get_logger

PREVIOUS = "#previous"  # cursors-table key suffix of a reader's cursor before its last batch
log = get_logger("buffer")


@dataclass
class Cursor:
    epoch: int = 0
    offset: int = 0
    batch_index: int = 0
    tasks_read: int = 0


@dataclass
class TasksetSettings:
    """What a taskset needs beyond its rows; fallbacks already resolved by the core."""

    workflow: str = ""
    reward_fn: str = ""
    format_args: dict[str, Any] = field(default_factory=dict)
    rollout_args: dict[str, Any] = field(default_factory=dict)
    workflow_args: dict[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    repeat_times: int = 1
    total_epochs: int = 1
    total_steps: int | None = None
    selector: str = "sequential"
    seed: int = 42
    target_pass_rate: float = 0.5
    temperature: float = 1.0
    feature_keys: list[str] = field(default_factory=list)  # non-empty: BOTS (difficulty_based only)
    bots: BotsConfig = field(default_factory=BotsConfig)


def easy_to_hard(rows: list[dict[str, Any]], keys: list[str], task_ids: list[str]) -> list[int]:
    """Row indices sorted by the `keys` columns, highest first (ties: the later row first), as
    Trinity's offline_easy2hard; a missing or non-numeric value is an error naming the row and column."""
    keyed = []
    for i, row in enumerate(rows):
        values = []
        for key in keys:
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidArgument(
                    f"row {i} (task {task_ids[i]!r}): column {key!r} must be a finite number for "
                    f"offline_easy2hard, got {value!r}",
                    field="feature_keys",
                )
            values.append(float(value))
        keyed.append((*values, i))
    return [int(k[-1]) for k in sorted(keyed, reverse=True)]


class TasksetBuffer:
    kind = "taskset"

    def __init__(
        self, name: str, db: Database, rows: list[dict[str, Any]], settings: TasksetSettings
    ) -> None:
        if not rows:
            raise InvalidArgument(f"taskset {name!r} has no rows", field="path")
        self.name = name
        self.db = db
        self.rows = rows
        self.cfg = settings
        self.task_ids = [task_id_of(r, i) for i, r in enumerate(rows)]
        self.index_of = {tid: i for i, tid in enumerate(self.task_ids)}
        self.cursors: dict[str, Cursor] = {}
        self.previous: dict[str, Cursor] = {}  # each reader's cursor before its last batch (repeat_last)
        self.pass_rates: dict[int, float] = {}
        # one batch (or feedback report) at a time: two calls never get the same batch, and two
        # reports never update the BOTS state from the same starting point
        self._lock = asyncio.Lock()
        self.features: np.ndarray | None = None  # [n, 2] prior pass rates (BOTS only)
        self.digest = ""  # of the task ids and features (BOTS only)
        self.bots_state = bots.initial_state(len(rows))
        self.easy_first: list[int] = []  # offline_easy2hard's fixed order
        if settings.selector == "offline_easy2hard":
            self.easy_first = easy_to_hard(rows, settings.feature_keys, self.task_ids)
        elif settings.feature_keys:
            self.features = bots.read_features(rows, settings.feature_keys, self.task_ids)
            self.digest = bots.data_digest(self.task_ids, self.features)

    async def load(self) -> None:
        async def q(conn: AsyncConnection) -> tuple[dict[str, float], Any]:
            fb = {r.task_id: r.pass_rate for r in (await conn.execute(select(s.feedback))).all()}
            return fb, (await conn.execute(select(s.bots_state))).first()

        self.cursors, self.previous = await load_cursors(self.db)
        fb, stored = await self.db.read(q)
        self.pass_rates = {self.index_of[t]: rate for t, rate in fb.items() if t in self.index_of}
        if self.features is not None and stored is not None:
            state = bots.unpack(stored, len(self.rows)) if stored.data_digest == self.digest else None
            if state is None:
                log.warning("bots_state_reset", taskset=self.name, reason="taskset rows or features changed")
            else:
                self.bots_state = state

    # ---- order ---------------------------------------------------------------------------
    def _indices(self, cur: Cursor, size: int, extend: bool = False) -> list[int]:
        """Row indices of the batch that starts at `cur` (epoch and offset already rolled over)."""
        n, kind, epoch, offset = len(self.rows), self.cfg.selector, cur.epoch, cur.offset
        if kind == "sequential":
            return list(range(offset, min(offset + size, n)))
        if kind == "offline_easy2hard":
            return self.easy_first[offset : offset + size]
        if kind == "shuffle":
            return [
                int(i)
                for i in np.random.default_rng(self.cfg.seed + epoch).permutation(n)[offset : offset + size]
            ]
        size = min(size, n - offset)
        if self.features is not None:
            return bots.select(self.bots_state, self.cfg.bots, size, self.cfg.seed + cur.tasks_read)
        # an extension shares its batch's index: seed it apart from the batch and the next one
        seed = (self.cfg.seed, cur.batch_index, cur.tasks_read) if extend else self.cfg.seed + cur.batch_index
        rng = np.random.default_rng(seed)
        if kind == "random":
            return [int(i) for i in rng.integers(0, n, size)]
        target, temp = self.cfg.target_pass_rate, self.cfg.temperature
        weights = np.array([math.exp(-abs(self.pass_rates.get(i, target) - target) / temp) for i in range(n)])
        return [int(i) for i in rng.choice(n, size=size, replace=False, p=weights / weights.sum())]

    def select_from(self, position: int, count: int) -> list[int]:
        """`count` row indices from the `position`-th task this taskset's selector hands out, wrapping
        over epochs (a mix of tasksets reads its members so, as Trinity's selectors do): the batch
        that starts at `position` runs to the end of its epoch, the rest starts the next one."""
        n, out = len(self.rows), []
        while count > 0:
            epoch, offset = divmod(position, n)
            take = min(count, n - offset)
            out += self._indices(Cursor(epoch, offset, batch_index=position, tasks_read=position), take)
            position, count = position + take, count - take
        return out

    def _advance(self, cur: Cursor, size: int, extend: bool = False) -> tuple[Cursor, list[int]] | None:
        """The cursor after the next batch (an extension of the last one) and its row indices; None
        at the end. An extension keeps the batch index, and total_steps (a count of batches) never
        ends it."""
        n = len(self.rows)
        nxt = Cursor(cur.epoch, cur.offset, cur.batch_index, cur.tasks_read)
        if not extend and self.cfg.total_steps is not None and nxt.batch_index >= self.cfg.total_steps:
            return None
        if (not self.cfg.is_eval and nxt.offset + size > n) or nxt.offset >= n:
            nxt.epoch, nxt.offset = nxt.epoch + 1, 0
        if self.cfg.total_steps is None and nxt.epoch >= self.cfg.total_epochs:
            return None
        indices = self._indices(nxt, size, extend)
        nxt.offset += len(indices)
        nxt.batch_index += 0 if extend else 1
        nxt.tasks_read += len(indices)
        return nxt, indices

    def task_at(self, i: int) -> Task:
        c = self.cfg
        return Task(
            workflow=c.workflow,
            reward_fn=c.reward_fn,
            raw_task=self.rows[i],
            format_args=c.format_args,
            rollout_args=c.rollout_args,
            workflow_args=c.workflow_args,
            is_eval=c.is_eval,
            task_id=self.task_ids[i],
            index=i,
            taskset=self.name,
            repeat_times=c.repeat_times,
        )

    # ---- API -----------------------------------------------------------------------------
    async def read_tasks(
        self,
        batch_size: int,
        *,
        reader_id: str = "",
        rewind: bool = False,
        repeat_last: bool = False,
        extend: bool = False,
    ) -> TaskBatch:
        if not self.cfg.is_eval and batch_size > len(self.rows):
            raise InvalidArgument(
                f"batch_size {batch_size} exceeds the {len(self.rows)} tasks of training taskset {self.name!r} "
                "(the last partial batch of an epoch is dropped, so no batch could ever be full)",
                field="batch_size",
            )
        if extend and (rewind or repeat_last):
            raise InvalidArgument("extend cannot be combined with rewind or repeat_last", field="extend")
        async with self._lock:
            if extend:
                return await self._extend_locked(batch_size, reader_id)
            return await self._read_locked(batch_size, reader_id, rewind, repeat_last)

    async def _extend_locked(self, batch_size: int, reader_id: str) -> TaskBatch:
        cur = self.cursors.get(reader_id)
        if cur is None or cur.batch_index == 0:
            raise FailedPrecondition(
                f"reader {reader_id!r} was handed no batch of taskset {self.name!r} to extend",
                field="extend",
            )
        step = self._advance(cur, batch_size, extend=True)
        if step is None:
            return TaskBatch([], cur.epoch, cur.batch_index - 1, True)
        nxt, indices = step
        await self._store_cursors(((reader_id, nxt),), lambda: self.cursors.__setitem__(reader_id, nxt))
        return TaskBatch([self.task_at(i) for i in indices], nxt.epoch, nxt.batch_index - 1, False)

    async def _store_cursors(self, cursors: tuple[tuple[str, Cursor], ...], after: Any) -> None:
        await store_cursors(self.db, cursors, after)

    async def _read_locked(
        self, batch_size: int, reader_id: str, rewind: bool, repeat_last: bool
    ) -> TaskBatch:
        if rewind:
            cur = Cursor()
        elif repeat_last and reader_id in self.previous:
            cur = self.previous[reader_id]
        else:
            cur = self.cursors.get(reader_id, Cursor())
        step = self._advance(cur, batch_size)
        if step is None:
            return TaskBatch([], cur.epoch, cur.batch_index, True)
        nxt, indices = step

        def after() -> None:
            self.cursors[reader_id] = nxt
            self.previous[reader_id] = cur

        await self._store_cursors(((reader_id, nxt), (reader_id + PREVIOUS, cur)), after)
        return TaskBatch([self.task_at(i) for i in indices], nxt.epoch, nxt.batch_index - 1, False)

    async def report_feedback(self, feedback: list[tuple[str, float]]) -> None:
        for k, (task_id, rate) in enumerate(feedback):
            if task_id not in self.index_of:
                raise InvalidArgument(
                    f"task {task_id!r} is not in taskset {self.name!r}", field=f"feedback[{k}].task_id"
                )
            if not 0.0 <= rate <= 1.0:
                raise InvalidArgument(
                    f"pass_rate must be in [0, 1], got {rate}", field=f"feedback[{k}].pass_rate"
                )

        async with self._lock:
            await self._store_feedback(feedback)

    async def _store_feedback(self, feedback: list[tuple[str, float]]) -> None:
        state = self.bots_state
        if self.features is not None:
            indices = [self.index_of[task_id] for task_id, _ in feedback]
            state = bots.update(state, self.features, self.cfg.bots, indices, [r for _, r in feedback])

        async def op(conn: AsyncConnection) -> None:
            for task_id, rate in feedback:
                stmt = sqlite_insert(s.feedback).values(task_id=task_id, pass_rate=rate, reports=1)
                await conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=["task_id"],
                        set_={"pass_rate": rate, "reports": s.feedback.c.reports + 1},
                    )
                )
            if self.features is not None:
                values = dict(data_digest=self.digest, **bots.pack(state))
                stmt = sqlite_insert(s.bots_state).values(id=1, **values)
                await conn.execute(stmt.on_conflict_do_update(index_elements=["id"], set_=values))

        def after(_: None) -> None:
            for task_id, rate in feedback:
                self.pass_rates[self.index_of[task_id]] = rate
            self.bots_state = state

        await self.db.write(op, after)

    def stats(self) -> dict[str, Any]:
        read = sum(c.tasks_read for c in self.cursors.values())
        ended = bool(self.cursors) and all(self._advance(c, 1) is None for c in self.cursors.values())
        return dict(depth=len(self.rows), written=read, read=read, end_of_data=ended, checked_at=time.time())


async def store_cursors(db: Database, cursors: tuple[tuple[str, Cursor], ...], after: Any) -> None:
    """Persist (reader key, cursor) pairs in one transaction, then run `after()`."""

    async def op(conn: AsyncConnection) -> None:
        for rid, c in cursors:
            values = dict(epoch=c.epoch, offset=c.offset, batch_index=c.batch_index, tasks_read=c.tasks_read)
            stmt = sqlite_insert(s.cursors).values(reader_id=rid, **values)
            await conn.execute(stmt.on_conflict_do_update(index_elements=["reader_id"], set_=values))

    await db.write(op, lambda _: after())


async def load_cursors(db: Database) -> tuple[dict[str, Cursor], dict[str, Cursor]]:
    """The stored cursors of each reader and each reader's cursor before its last batch."""

    async def q(conn: AsyncConnection) -> dict[str, Cursor]:
        rows = (await conn.execute(select(s.cursors))).all()
        return {r.reader_id: Cursor(r.epoch, r.offset, r.batch_index, r.tasks_read) for r in rows}

    cursors = await db.read(q)
    current = {k: c for k, c in cursors.items() if not k.endswith(PREVIOUS)}
    return current, {k.removesuffix(PREVIOUS): c for k, c in cursors.items() if k.endswith(PREVIOUS)}
