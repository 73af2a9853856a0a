"""Priority queue (Trinity's `use_priority_queue`): highest priority first, ties by arrival.

Priority functions are Trinity's:
- `linear_decay(decay=2.0)`: priority = model_version - decay * use_count; always reused.
- `decay_limit_randomization(decay=2.0, use_count_limit=3, sigma=0.0)`: the same plus Gaussian
  noise of std `sigma`; an item is put back only while use_count < use_count_limit.

Ack of a read item: without `reuse_cooldown_time` it is consumed (Trinity: "experiences can not
be reused"); with it, its use_count (already counted at read) gives it a new priority and it
becomes readable again `reuse_cooldown_time` seconds later (unless the fn says not to put it
back). At capacity a write evicts the lowest-priority readable items (ties: oldest first), which
may be the items just written; leased items are never evicted.
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
        return cls(**args)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise InvalidArgument(f"bad priority_fn_args for {name!r}: {exc}", field="priority_fn_args") from exc


class PriorityBuffer(ItemBuffer):
    kind = "priority"
    order_by = "priority DESC, id ASC"

    def __init__(
        self, *args: Any, priority_fn: PriorityFn, reuse_cooldown_time: float | None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.priority_fn = priority_fn
        self.reuse_cooldown_time = reuse_cooldown_time

    async def load(self) -> None:
        async def op(conn: AsyncConnection) -> None:
            await conn.exec_driver_sql(s.PRIORITY_INDEX)

        await self.db.write(op)
        await super().load()

    def priority_of(self, model_version: int, use_count: int) -> float:
        return self.priority_fn(model_version, use_count)[0]

    @staticmethod
    def _sort_key(row: Any) -> tuple[float, int]:
        return (-row[1], row[0])  # (id, priority, payload)

    async def _evict(self, conn: AsyncConnection, now: float, inserted: int) -> list[float]:
        if self.capacity is None:
            return []
        # Counted in the file, not the mirror: earlier writes of this commit group are not mirrored yet.
        stored = (await conn.execute(text("SELECT count(*) FROM items WHERE state IN (0, 1)"))).scalar() or 0
        excess = stored - self.capacity
        if excess <= 0:
            return []
        rows = (
            await conn.execute(
                text(
                    "DELETE FROM items WHERE id IN (SELECT id FROM items WHERE state = 0 ORDER BY priority ASC, id ASC "
                    "LIMIT :n) RETURNING ready_at"
                ),
                {"n": excess},
            )
        ).all()
        return [float(r[0]) for r in rows]

    async def _ack_rows(
        self, conn: AsyncConnection, lease_id: str, now: float
    ) -> tuple[int, int, list[float]]:
        rows = (
            await conn.execute(
                text("SELECT id, model_version, use_count FROM items WHERE lease_id = :lease AND state = 1"),
                {"lease": lease_id},
            )
        ).all()
        if self.reuse_cooldown_time is None:
            await conn.execute(
                text("DELETE FROM items WHERE lease_id = :lease AND state = 1"), {"lease": lease_id}
            )
            return len(rows), 0, []
        ready_at = now + self.reuse_cooldown_time
        keep, drop = [], []
        for row in rows:
            priority, put_back = self.priority_fn(row.model_version, row.use_count)
            (keep if put_back else drop).append({"i": row.id, "p": priority})
        if drop:
            await conn.execute(text("DELETE FROM items WHERE id = :i"), drop)
        if keep:
            await conn.execute(
                text(
                    "UPDATE items SET state = 0, lease_id = NULL, lease_expires = NULL, priority = :p, ready_at = :r WHERE id = :i"
                ),
                [{**k, "r": ready_at} for k in keep],
            )
        return len(rows), len(keep), [ready_at] * len(keep)
