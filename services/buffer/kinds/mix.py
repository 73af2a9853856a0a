"""Several training tasksets read as one (`buffer.explorer_input.tasksets`), by Trinity's rules.

The mixing is Trinity-RFT's TasksetScheduler (trinity/buffer/task_scheduler.py), number for number:
- an epoch's schedule lists set i len(set i) times, in set order, shuffled by numpy's
  `default_rng(epoch).shuffle` (the epoch index alone seeds it, as in Trinity); so each batch
  mixes the sets in proportion to their sizes, and an epoch reads every set once over;
- the schedules of epochs 0, 1, ... end to end are one stream of set ids; batch k takes stream
  positions [k*B, (k+1)*B) (B = buffer.batch_size): a batch may straddle two epochs, nothing is
  dropped;
- in a batch the sets come in the order of their first position in it, and set i's c tasks are the
  next c its own task_selector hands out, wrapping over that set's epochs (TasksetBuffer.select_from:
  sequential reads file order again, shuffle the permutation of seed + the set's epoch, ...);
- the mix ends after buffer.total_steps batches, else when the stream has no full batch left within
  buffer.total_epochs epochs (Trinity's total_epochs * N // B steps, N = all tasks).

The persisted cursor of a reader is (batch index, stream position); a set's own position is the count
of its id before the stream position, so it needs no cursor of its own and a restart (of the buffer or
of the explorer, which repeats its last batch) reads exactly the same tasks. An extension (dynamic
sampling's refill) takes the next B stream positions under the same batch index.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from services.buffer.kinds.taskset import PREVIOUS, Cursor, TasksetBuffer, load_cursors, store_cursors
from services.buffer.storage.engine import Database
from services.buffer.types import TaskBatch
from services.common.errors import FailedPrecondition, InvalidArgument


class MixSchedule:
    """Which set each stream position reads (pure; `sizes[i]` = tasks of set i)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        if not sizes or any(n < 1 for n in sizes):
            raise InvalidArgument(
                f"a mix needs non-empty tasksets, got sizes {list(sizes)}", field="tasksets"
            )
        self.sizes = tuple(sizes)
        self.total = sum(sizes)
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        """Set ids of epoch `epoch`, in reading order."""
        if epoch not in self._orders:
            ids = [i for i, n in enumerate(self.sizes) for _ in range(n)]
            np.random.default_rng(epoch).shuffle(ids)
            self._orders[epoch] = ids
            while len(self._orders) > 2:  # a batch spans at most two epochs
                self._orders.pop(next(iter(self._orders)))
        return self._orders[epoch]

    def ids(self, start: int, count: int) -> list[int]:
        """Set ids of stream positions [start, start + count)."""
        out: list[int] = []
        while count > 0:
            epoch, offset = divmod(start, self.total)
            part = self.order(epoch)[offset : offset + count]
            out += part
            start, count = start + len(part), count - len(part)
        return out

    def positions(self, start: int) -> list[int]:
        """Tasks each set has handed out before stream position `start`."""
        epoch, offset = divmod(start, self.total)
        seen = np.bincount(self.order(epoch)[:offset], minlength=len(self.sizes))
        return [epoch * n + int(k) for n, k in zip(self.sizes, seen, strict=True)]

    def plan(self, start: int, count: int) -> list[tuple[int, int, int]]:
        """(set, its position, tasks) of the batch at stream positions [start, start + count): the sets
        in the order of their first position in it (Trinity's Counter order)."""
        counts: dict[int, int] = {}
        for i in self.ids(start, count):
            counts[i] = counts.get(i, 0) + 1
        positions = self.positions(start)
        return [(i, positions[i], c) for i, c in counts.items()]


class TasksetMix:
    """The members' tasks under one name; see the module docstring."""

    kind = "taskset"

    def __init__(
        self,
        name: str,
        db: Database,
        members: Sequence[TasksetBuffer],
        *,
        total_epochs: int = 1,
        total_steps: int | None = None,
    ) -> None:
        evals = [m.name for m in members if m.cfg.is_eval]
        if evals:
            raise InvalidArgument(f"eval tasksets {evals} cannot be mixed for training", field="tasksets")
        self.name = name
        self.db = db
        self.members = list(members)
        self.schedule = MixSchedule([len(m.rows) for m in members])
        self.total_epochs = total_epochs
        self.total_steps = total_steps
        self.cursors: dict[str, Cursor] = {}
        self.previous: dict[str, Cursor] = {}
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        self.cursors, self.previous = await load_cursors(self.db)

    def _next(self, cur: Cursor, size: int, extend: bool) -> Cursor | None:
        """The cursor after the batch (extension) of `size` tasks at `cur`; None at the end."""
        if self.total_steps is not None:
            if not extend and cur.batch_index >= self.total_steps:
                return None
        elif cur.tasks_read + size > self.total_epochs * self.schedule.total:
            return None
        end = cur.tasks_read + size
        epoch, offset = divmod(end, self.schedule.total)
        return Cursor(epoch, offset, cur.batch_index + (0 if extend else 1), end)

    def _batch(self, cur: Cursor, nxt: Cursor, size: int) -> TaskBatch:
        tasks = []
        for member, position, count in self.schedule.plan(cur.tasks_read, size):
            taskset = self.members[member]
            tasks += [taskset.task_at(i) for i in taskset.select_from(position, count)]
        return TaskBatch(tasks, cur.tasks_read // self.schedule.total, nxt.batch_index - 1, False)

    async def read_tasks(
        self,
        batch_size: int,
        *,
        reader_id: str = "",
        rewind: bool = False,
        repeat_last: bool = False,
        extend: bool = False,
    ) -> TaskBatch:
        if self.total_steps is None and batch_size > self.total_epochs * self.schedule.total:
            raise InvalidArgument(
                f"batch_size {batch_size} exceeds the {self.schedule.total} tasks of tasksets "
                f"{[m.name for m in self.members]} over {self.total_epochs} epoch(s): no batch could be full",
                field="batch_size",
            )
        if extend and (rewind or repeat_last):
            raise InvalidArgument("extend cannot be combined with rewind or repeat_last", field="extend")
        async with self._lock:
            if extend:
                cur = self.cursors.get(reader_id)
                if cur is None or cur.batch_index == 0:
                    raise FailedPrecondition(
                        f"reader {reader_id!r} was handed no batch of {self.name!r} to extend", field="extend"
                    )
            elif rewind:
                cur = Cursor()
            elif repeat_last and reader_id in self.previous:
                cur = self.previous[reader_id]
            else:
                cur = self.cursors.get(reader_id, Cursor())
            nxt = self._next(cur, batch_size, extend)
            if nxt is None:
                last = cur.batch_index - 1 if extend else cur.batch_index
                return TaskBatch([], cur.tasks_read // self.schedule.total, last, True)
            batch = self._batch(cur, nxt, batch_size)
            stored = ((reader_id, nxt),) if extend else ((reader_id, nxt), (reader_id + PREVIOUS, cur))

            def after(cur: Cursor = cur, nxt: Cursor = nxt) -> None:
                self.cursors[reader_id] = nxt
                if not extend:
                    self.previous[reader_id] = cur

            await store_cursors(self.db, stored, after)
            return batch

    def stats(self) -> dict[str, Any]:
        read = sum(c.tasks_read for c in self.cursors.values())
        ended = bool(self.cursors) and all(self._next(c, 1, False) is None for c in self.cursors.values())
        return dict(
            depth=self.schedule.total, written=read, read=read, end_of_data=ended, checked_at=time.time()
        )
