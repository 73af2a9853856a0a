"""Priority queue (Trinity's `use_priority_queue`): highest priority first, ties by arrival.

Priority functions are Trinity's:
- `linear_decay(decay=2.0)`: priority = model_version - decay * use_count; always reused.
- `decay_limit_randomization(decay=2.0, use_count_limit=3, sigma=0.0)`: the same plus Gaussian
  noise of std `sigma`; an item is put back only while use_count < use_count_limit.

What follows Trinity's AsyncPriorityQueue (trinity/buffer/storage/queue.py), because its tests
pin orderings that users carry over (tests/unit/buffer/kinds/test_priority.py derives them):
- A read takes items out of the queue and counts a use. With `reuse_cooldown_time` an item
  re-enters `reuse_cooldown_time` seconds after its *read* with its new priority (unless the fn
  says not to put it back); without it, a read item is used once.
- Ties are served in order of (re-)entry: a reused item goes behind the items already waiting
  at its priority (ENTERED_AT in storage/schema.py: the write, or the end of the cooldown).
- Capacity bounds the items *in the queue*: read items (leased or cooling down) do not count.
  Whenever items enter (a write, or a cooldown that ended) and the queue holds more than
  `capacity`, the lowest-priority items go, the earliest-entered first among ties; so an
  arrival lower than everything queued is dropped and one equal to the lowest replaces it.

Where we deliberately differ, and why:
- Leases. Trinity hands items out for good. Here a read leases them: the reuse (or, without a
  cooldown, the removal) takes effect at Ack, with the cooldown still counted from the read, so
  an Ack later than the cooldown makes the item readable at once. Nack or lease expiry returns
  the items unused (use_count as before, at their old place), so a crashed trainer loses nothing.
- Capacity counts experiences, not write calls. Trinity's queue holds "items" that are each one
  `put` (a list of experiences sharing one priority) and reads whole items; ours are rows per
  experience, read one by one, as the fifo kind counts them. Trinity's capacity-4 queue of
  2-experience writes is a capacity-8 queue here (the same orderings, as whole writes of one
  priority enter and leave together).
- Cooldowns run on the wall clock in the file, not in a timer task, so they survive a restart;
  an item whose cooldown ended competes for room at the next write or read, which gives the
  same result as Trinity's insert-at-the-moment (the queue keeps the top `capacity` either way).
"""

from __future__ import annotations

import importlib
import random
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.buffer.kinds.items import ItemBuffer
from services.buffer.storage import schema as s
from services.common.errors import InvalidArgument


class PriorityFn(Protocol):
    def __call__(self, model_version: int, use_count: int) -> tuple[float, bool]:
        """Returns (priority, put_back_into_queue)."""
        ...


class LinearDecay:
    def __init__(self, decay: float = 2.0) -> None:
        self.decay = float(decay)

    def __call__(self, model_version: int, use_count: int) -> tuple[float, bool]:
        return model_version - self.decay * use_count, True


class DecayLimitRandomization:
    def __init__(
        self, decay: float = 2.0, use_count_limit: int = 3, sigma: float = 0.0, seed: int | None = None
    ) -> None:
        self.decay = float(decay)
        self.use_count_limit = int(use_count_limit)
        self.sigma = float(sigma)
        self._rng = random.Random(seed)

    def __call__(self, model_version: int, use_count: int) -> tuple[float, bool]:
        priority = model_version - self.decay * use_count
        if self.sigma > 0:
            priority += self._rng.gauss(0.0, self.sigma)
        keep = use_count < self.use_count_limit if self.use_count_limit > 0 else True
        return priority, keep


# The registry: built-ins by Trinity's names; anything else is a dotted path "pkg.module.Class".
PRIORITY_FNS: dict[str, type] = {
    "linear_decay": LinearDecay,
    "decay_limit_randomization": DecayLimitRandomization,
}


def make_priority_fn(name: str, args: dict[str, Any]) -> PriorityFn:
    cls: Any = PRIORITY_FNS.get(name)
    if cls is None and "." in name:
        module, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise InvalidArgument(f"cannot import priority_fn {name!r}: {exc}", field="priority_fn") from exc
    if cls is None:
        raise InvalidArgument(
            f"unknown priority_fn {name!r}; use one of {sorted(PRIORITY_FNS)} or a dotted path",
            field="priority_fn",
        )
    try:
        return cls(**args)
    except TypeError as exc:
        raise InvalidArgument(f"bad priority_fn_args for {name!r}: {exc}", field="priority_fn_args") from exc


class PriorityBuffer(ItemBuffer):
    kind = "priority"
    order_by = f"priority DESC, {s.ENTERED_AT}, id"

    def __init__(
        self, *args: Any, priority_fn: PriorityFn, reuse_cooldown_time: float | None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.priority_fn = priority_fn
        self.reuse_cooldown_time = reuse_cooldown_time

    async def load(self) -> None:
        async def op(conn: AsyncConnection) -> None:
            await conn.exec_driver_sql(s.OLD_PRIORITY_INDEX)
            await conn.exec_driver_sql(s.PRIORITY_INDEX)

        await self.db.write(op)
        await super().load()

    def priority_of(self, model_version: int, use_count: int) -> float:
        return self.priority_fn(model_version, use_count)[0]

    @staticmethod
    def _sort_key(row: Any) -> tuple[float, float, int]:
        return (-row[1], row[3], row[0])  # (id, priority, payload, entered_at)

    async def _evict(self, conn: AsyncConnection, now: float, inserted: int) -> list[float]:
        return await self._trim(conn, now)

    async def _settle(self, conn: AsyncConnection, now: float) -> int:
        return len(await self._trim(conn, now))

    async def _trim(self, conn: AsyncConnection, now: float) -> list[float]:
        """Drop the lowest queued items past capacity; returns their ready_at (all due).

        Only queued rows (READY and due) count, as in Trinity leased and cooling items are out of
        the queue. Counted in the file, not the mirror: this commit group is not mirrored yet.
        """
        if self.capacity is None:
            return []
        queued = "state = 0 AND ready_at <= :now"
        count = text(f"SELECT count(*) FROM items WHERE {queued}")
        excess = ((await conn.execute(count, {"now": now})).scalar() or 0) - self.capacity
        if excess <= 0:
            return []
        lowest = (
            f"SELECT id FROM items WHERE {queued} ORDER BY priority ASC, {s.ENTERED_AT} ASC, id ASC LIMIT :n"
        )
        delete = text(f"DELETE FROM items WHERE id IN ({lowest}) RETURNING ready_at")
        return [float(r[0]) for r in (await conn.execute(delete, {"now": now, "n": excess})).all()]

    async def _ack_rows(
        self, conn: AsyncConnection, lease_id: str, now: float
    ) -> tuple[int, int, list[float]]:
        """Put the lease's items back (cooldown from their read) or consume them."""
        rows = (
            await conn.execute(
                text(
                    "SELECT id, model_version, use_count, leased_at FROM items WHERE lease_id = :lease AND state = 1"
                ),
                {"lease": lease_id},
            )
        ).all()
        keep, drop = self._reuse_plan(rows, now)
        if drop:
            await conn.execute(text("DELETE FROM items WHERE id = :i"), [{"i": i} for i in drop])
        if keep:
            await conn.execute(
                text(
                    "UPDATE items SET state = 0, lease_id = NULL, lease_expires = NULL, priority = :p, ready_at = :r "
                    "WHERE id = :i"
                ),
                keep,
            )
        return len(rows), len(keep), [k["r"] for k in keep]

    def _reuse_plan(self, rows: Any, now: float) -> tuple[list[dict[str, Any]], list[int]]:
        """Which acked rows go back (with new priority and ready_at) and which are used up."""
        if self.reuse_cooldown_time is None:
            return [], [row.id for row in rows]
        keep: list[dict[str, Any]] = []
        drop: list[int] = []
        for row in rows:
            priority, put_back = self.priority_fn(row.model_version, row.use_count)
            read_at = now if row.leased_at is None else row.leased_at  # leased before the column existed
            if put_back:
                keep.append({"i": row.id, "p": priority, "r": read_at + self.reuse_cooldown_time})
            else:
                drop.append(row.id)
        return keep, drop
