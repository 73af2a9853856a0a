"""Experience buffers (fifo, priority, table), write side: the mirror, writes, writers, stats.

An item is one Experience kept as the protobuf bytes its writer sent. Rows move READY ->
LEASED (Read) -> gone / DONE / READY again (Ack, by kind), or back to READY (Nack, lease
expiry). The kinds differ only in their hooks: the read order, what Ack does, and what a write
does at capacity (fifo.py, priority.py, table.py).

In-memory state mirrors the file (counts, leases, cooldowns, writers) and is changed only by
the `after` callbacks the writer task runs right after each commit (storage/engine.py), so
waiting readers and writers can decide without a query. It is rebuilt from the file on open.
`ItemStore` holds that state and the write path; `items.ItemBuffer` adds leased reads and acks.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy import select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from services.buffer.kinds.item_state import (
    INSERT_ITEMS,
    INSERT_PAYLOADS,
    LAST_ID,
    ItemStats,
    Lease,
    Mirror,
    bump,
)
from services.buffer.kinds.write_keys import (
    INSERT_KEY,
    add_digest_column,
    check_same_content,
    content_digest,
    stored_digest,
)
from services.buffer.storage import schema as s
from services.buffer.storage.engine import Database
from services.buffer.types import ItemIn, WriteResult
from services.common.errors import InvalidArgument


class ItemStore:
    """The write side of every item buffer; `items.ItemBuffer` adds reads. Subclasses set the hooks."""

    kind: ClassVar[str] = ""
    order_by: ClassVar[str] = "id"

    def __init__(
        self, name: str, db: Database, *, capacity: int | None, max_read_timeout: float, lease_s: float
    ) -> None:
        self.name = name
        self.db = db
        self.capacity = capacity
        self.max_read_timeout = max_read_timeout
        self.lease_s = lease_s
        self.m = Mirror()
        self._changed = asyncio.Event()
        self._reserved = 0  # items of writes admitted but not yet committed (fifo backpressure)
        # Keys committed by this process -> content digest, newest last (the write transaction
        # checks the file too).
        self._recent_keys: dict[str, bytes] = {}

    # ---- hooks -------------------------------------------------------------------------
    def priority_of(self, model_version: int, use_count: int) -> float:
        return 0.0

    async def _admit(self, n: int, timeout: float | None) -> None:
        """Wait until `n` items fit (fifo); default: always fits."""

    async def _evict(self, conn: AsyncConnection, now: float, inserted: int) -> list[float]:
        """Make room after an insert (priority); returns ready_at of evicted rows."""
        return []

    async def _settle(self, conn: AsyncConnection, now: float) -> int:
        """Before a claim: apply what happened since the last commit (priority: cooldowns that
        ended may overfill the queue); returns the rows dropped."""
        return 0

    async def _ack_rows(
        self, conn: AsyncConnection, lease_id: str, now: float
    ) -> tuple[int, int, list[float]]:
        """Finish a lease's rows: returns (acked, rows back in READY, their ready_at list)."""
        raise NotImplementedError

    # ---- open --------------------------------------------------------------------------
    async def load(self) -> None:
        """Rebuild the in-memory mirror from the file."""
        self.m = await self.db.read(self._load)

    async def _load(self, conn: AsyncConnection) -> Mirror:
        m = Mirror()
        now = time.time()
        row = (await conn.execute(select(s.counters).where(s.counters.c.id == 1))).first()
        if row is not None:
            m.counters = dict(written=row.written, read=row.read, acked=row.acked, dropped=row.dropped)
        q = "SELECT state, count(*) FROM items WHERE state IN (0, 1) GROUP BY state"
        for state, n in (await conn.execute(text(q))).all():
            if state == s.READY:
                m.ready = n
            else:
                m.leased = n
        q = "SELECT ready_at, count(*) FROM items WHERE state = 0 AND ready_at > :now GROUP BY ready_at"
        m.cooling = {r: n for r, n in (await conn.execute(text(q), {"now": now})).all()}
        q = (
            "SELECT lease_id, min(lease_expires), count(*), max(leased_by) FROM items WHERE state = 1 "
            "GROUP BY lease_id"
        )
        m.leases = {lid: Lease(exp, n, by or "") for lid, exp, n, by in (await conn.execute(text(q))).all()}
        m.writers = {
            w: bool(c)
            for w, c in (await conn.execute(select(s.writers.c.writer_id, s.writers.c.closed))).all()
        }
        return m

    async def ensure_counters(self) -> None:
        """Counters row, payload trigger, and files from before `payloads` moved out of `items` or
        before `leased_at` / `leased_by`."""

        async def op(conn: AsyncConnection) -> None:
            await conn.execute(sqlite_insert(s.counters).values(id=1).on_conflict_do_nothing())
            info: Sequence[Any] = (await conn.exec_driver_sql("PRAGMA table_info(items)")).all()
            columns = [row[1] for row in info]  # (cid, name, type, notnull, dflt_value, pk)
            if "payload" in columns:
                await conn.exec_driver_sql(
                    "INSERT OR IGNORE INTO payloads (id, payload) SELECT id, payload FROM items"
                )
                await conn.exec_driver_sql("ALTER TABLE items DROP COLUMN payload")
            if "leased_at" not in columns:
                await conn.exec_driver_sql("ALTER TABLE items ADD COLUMN leased_at FLOAT")
            if "leased_by" not in columns:
                await conn.exec_driver_sql("ALTER TABLE items ADD COLUMN leased_by VARCHAR")
            await conn.exec_driver_sql(s.PAYLOADS_TRIGGER)
            await add_digest_column(conn)

        await self.db.write(op)

    # ---- derived state -----------------------------------------------------------------
    def available(self, now: float | None = None) -> int:
        """Rows a claim could take now: READY and due, plus rows of expired leases."""
        now = time.time() if now is None else now
        for due in [t for t in self.m.cooling if t <= now]:
            del self.m.cooling[due]
        expired = sum(lease.count for lease in self.m.leases.values() if lease.expires_at <= now)
        return self.m.ready - sum(self.m.cooling.values()) + expired

    def held(self, now: float | None = None) -> tuple[int, int]:
        """(leases, rows) under a lease that has not expired: what readers hold and have not acked."""
        now = time.time() if now is None else now
        live = [lease.count for lease in self.m.leases.values() if lease.expires_at > now]
        return len(live), sum(live)

    def end_of_data(self) -> bool:
        """Every declared writer closed and nothing is left that could be read."""
        writers = self.m.writers
        return bool(writers) and all(writers.values()) and self.m.ready == 0 and self.m.leased == 0

    def writers_closed(self) -> bool:
        """Writers were declared and every one has closed: no new rows will come."""
        return bool(self.m.writers) and all(self.m.writers.values())

    def drained_for(self, reader_id: str) -> bool:
        """Nothing more can reach `reader_id`: every declared writer closed, nothing readable or
        cooling, and every lease still out is this reader's own (it will not come back to it while
        the reader lives). A reader's last batch may be short (DAPO's steps that hit their refill
        cap write fewer rows): this is how it learns there is no more, instead of waiting forever
        on rows it holds itself."""
        if not self.writers_closed() or self.available() > 0 or self.m.cooling:
            return False
        now = time.time()
        return all(lease.reader == reader_id for lease in self.m.leases.values() if lease.expires_at > now)

    def _nothing_more_coming(self) -> bool:
        """Writers all closed and nothing readable is left (rows under lease may still come back)."""
        writers = self.m.writers
        return bool(writers) and all(writers.values()) and self.available() == 0

    def _next_wakeup(self, now: float) -> float | None:
        times = [lease.expires_at for lease in self.m.leases.values()] + list(self.m.cooling)
        future = [t for t in times if t > now]
        return min(future) if future else None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, until: float | None) -> None:
        """Wait for a commit that may change what can be read/written, or until `until` (unix s)."""
        event = self._changed
        timeout = None if until is None else max(0.0, until - time.time())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    # ---- write -------------------------------------------------------------------------
    async def write(
        self, items: Sequence[ItemIn], *, key: str = "", writer_id: str = "", timeout: float | None = None
    ) -> WriteResult:
        """Store `items` in one transaction. A known `key` stores nothing: "duplicate" when the
        content is the same, AlreadyExists when it differs (kinds/write_keys.py)."""
        if key and key in self._recent_keys:  # committed before: answer without waiting for room
            check_same_content(self.name, key, self._recent_keys[key], content_digest(items), len(items))
            return WriteResult(written=0, duplicate=True)
        n = len(items)
        await self._admit(n, timeout)
        self._reserved += n
        try:
            result, _, _, (_, stored, digest) = await self.db.write(
                lambda conn: self._write_op(conn, items, key, writer_id), self._after_write
            )
        finally:
            self._reserved -= n
        if result.duplicate:
            check_same_content(self.name, key, stored, digest, n)
        return result

    async def _write_op(
        self, conn: AsyncConnection, items: Sequence[ItemIn], key: str, writer_id: str
    ) -> tuple[WriteResult, list[float], str, tuple[str, bytes, bytes]]:
        """Returns (result, ready_at of evicted rows, writer_id, (key, digest in the file, digest
        of `items`)); a known key stores nothing (the caller compares the digests)."""
        digest = b""
        if key:
            digest = content_digest(items)  # here, on the writer thread, off the event loop
            stored = await stored_digest(conn, key)
            if stored is not None:
                return WriteResult(written=0, duplicate=True), [], "", (key, stored, digest)
        now = time.time()
        prio = self.priority_of
        rows: list[tuple[Any, ...]] = []
        if items:  # the hot path: the driver's executemany, no per-row SQLAlchemy work
            first = int((await conn.exec_driver_sql(LAST_ID)).scalar() or 0) + 1
            ids = range(first, first + len(items))
            pairs = list(zip(ids, items, strict=True))
            rows = [(i, s.READY, it.model_version, prio(it.model_version, 0), 0, 0.0, now) for i, it in pairs]
            await conn.exec_driver_sql(INSERT_ITEMS, rows)
            await conn.exec_driver_sql(INSERT_PAYLOADS, [(i, it.payload) for i, it in pairs])
        evicted = await self._evict(conn, now, len(rows))
        result = WriteResult(written=len(rows), evicted=len(evicted))
        if key:
            await conn.exec_driver_sql(INSERT_KEY, (key, result.written, result.evicted, now, digest))
        if writer_id and writer_id not in self.m.writers:
            await conn.execute(
                sqlite_insert(s.writers).values(writer_id=writer_id, closed=0).on_conflict_do_nothing()
            )
        await bump(conn, written=result.written, dropped=result.evicted)
        return result, evicted, writer_id, (key, digest, digest)

    def _after_write(self, out: tuple[WriteResult, list[float], str, tuple[str, bytes, bytes]]) -> None:
        result, evicted, writer_id, (key, stored, _) = out
        if key:
            self._recent_keys[key] = stored
            if len(self._recent_keys) > 100_000:
                del self._recent_keys[next(iter(self._recent_keys))]
        if result.duplicate:
            return
        self.m.ready += result.written - len(evicted)
        self._forget_cooling(evicted)
        self.m.counters["written"] += result.written
        self.m.counters["dropped"] += result.evicted
        if writer_id:
            self.m.writers.setdefault(writer_id, False)
        self._notify()

    def _forget_cooling(self, ready_ats: list[float]) -> None:
        now = time.time()
        for t in ready_ats:
            if t > now and t in self.m.cooling:
                self.m.cooling[t] -= 1
                if self.m.cooling[t] <= 0:
                    del self.m.cooling[t]

    # ---- writers -----------------------------------------------------------------------
    async def set_writer(self, writer_id: str, closed: bool) -> None:
        """Declare (closed=False) or close a writer; closing an undeclared writer declares it closed."""
        if not writer_id:
            raise InvalidArgument("writer_id must not be empty", field="writer_id")

        async def op(conn: AsyncConnection) -> None:
            stmt = sqlite_insert(s.writers).values(writer_id=writer_id, closed=int(closed))
            if closed:
                stmt = stmt.on_conflict_do_update(index_elements=["writer_id"], set_={"closed": 1})
            else:  # re-opening a closed writer starts a new stream of data
                stmt = stmt.on_conflict_do_update(index_elements=["writer_id"], set_={"closed": 0})
            await conn.execute(stmt)

        def after(_: None) -> None:
            self.m.writers[writer_id] = closed
            self._notify()

        await self.db.write(op, after)

    # ---- stats / scan ------------------------------------------------------------------
    async def stats(self) -> ItemStats:
        async def q(conn: AsyncConnection) -> tuple[dict[int, int], float | None]:
            per = "SELECT model_version, count(*) FROM items WHERE state IN (0, 1) GROUP BY model_version"
            versions = {int(v): int(n) for v, n in (await conn.execute(text(per))).all()}
            oldest = (await conn.execute(text("SELECT min(created_at) FROM items WHERE state = 0"))).scalar()
            return versions, oldest

        versions, oldest = await self.db.read(q)
        now = time.time()
        _, leased = self.held(now)
        c = self.m.counters
        return ItemStats(
            depth=self.available(now),
            leased=leased,
            written=c["written"],
            read=c["read"],
            acked=c["acked"],
            dropped=c["dropped"],
            per_model_version=versions,
            oldest_item_age_s=max(0.0, now - oldest) if oldest is not None else 0.0,
            end_of_data=self.end_of_data(),
        )

    async def scan(self, offset: int, limit: int) -> tuple[list[bytes], int]:
        """Rows from position `offset` (0-based, arrival order), whatever their state."""
        raise InvalidArgument(
            f"buffer {self.name!r} is a {self.kind}; ScanTable reads table buffers", field="buffer"
        )

    def spec_json(self) -> str:
        return json.dumps({"kind": self.kind})
