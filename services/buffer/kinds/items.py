"""Experience buffers (fifo, priority, table), read side: leased reads, ack, nack, lease expiry.

`ItemBuffer` is the base class of the three kinds (fifo.py, priority.py, table.py): the write side
and the in-memory mirror come from `item_store.ItemStore`, the records and SQL helpers from
item_state.py. A Read claims READY rows under a lease in one transaction; Ack applies the kind's
hook to them, Nack or an expired lease puts them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.buffer.kinds.item_state import (
    LEASE_SEP,
    Claimed,
    Lease,
    bump,
    with_payloads,
)
from services.buffer.kinds.item_store import ItemStore
from services.buffer.storage import schema as s
from services.buffer.types import ReadResult
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound


class ItemBuffer(ItemStore):
    """Base of fifo / priority / table; subclasses set the hooks (see item_store.ItemStore)."""

    # ---- read --------------------------------------------------------------------------
    async def read(
        self,
        batch_size: int,
        *,
        max_wait: float = -1.0,
        lease_s: float = 0.0,
        min_model_version: int = 0,
        reader_id: str = "",
    ) -> ReadResult:
        """Lease up to `batch_size` items, waiting up to `max_wait` s (negative: max_read_timeout).

        The lease records `reader_id`, so `nack_reader` can give it back without its id."""
        wait = self.max_read_timeout if max_wait < 0 else max_wait
        deadline = time.time() + wait
        lease_id = f"{self.name}{LEASE_SEP}{uuid.uuid4().hex}"
        lease_len = lease_s if lease_s > 0 else self.lease_s
        try:
            return await self._lease_batch(
                lease_id, batch_size, deadline, lease_len, min_model_version, reader_id
            )
        except BaseException:
            # The caller is gone (cancelled: the client hung up or gave up) and never learns the
            # lease: give back what it holds now instead of after the lease runs out. Shielded, as
            # this task is being cancelled; if it fails, lease expiry still returns the rows.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._give_back([lease_id]))
            raise

    async def _lease_batch(
        self,
        lease_id: str,
        batch_size: int,
        deadline: float,
        lease_len: float,
        min_model_version: int,
        reader_id: str,
    ) -> ReadResult:
        got: list[Any] = []
        first_claim_at = 0.0
        while True:
            now = time.time()
            missing = batch_size - len(got)
            if (
                self.available(now) >= missing
                or (now >= deadline and self.available(now) > 0)
                or (min_model_version and self.available(now))
                or (self.writers_closed() and self.available(now))  # no more is coming: take what is
            ):
                claimed = await self.db.write(
                    functools.partial(
                        self._claim_op,
                        lease_id=lease_id,
                        lease_len=lease_len,
                        n=missing,
                        min_version=min_model_version,
                        reader=reader_id,
                    ),
                    self._after_claim,
                )
                if claimed.rows and not got:  # from the commit: its own latency is no waiting
                    first_claim_at = time.time()
                got.extend(claimed.rows)
            if (
                len(got) >= batch_size
                or time.time() >= deadline
                or self.end_of_data()
                or (got and self._nothing_more_coming())
                or (reader_id and self.drained_for(reader_id))
            ):
                break
            wake = self._next_wakeup(now)
            await self._wait_change(deadline if wake is None else min(deadline, wake))
        got.sort(key=self._sort_key)
        # a named reader is told when nothing more can reach it (its rows included: a short last batch)
        last = bool(reader_id) and self.drained_for(reader_id)
        if not got:
            return ReadResult("", [], self.end_of_data() or last, 0.0)
        if time.time() - first_claim_at > 0.05:  # waited while holding items: the lease starts now
            await self._extend(lease_id, time.time() + lease_len)
        return ReadResult(lease_id, [r[2] for r in got], last, self.m.leases[lease_id].expires_at)

    async def _extend(self, lease_id: str, expires: float) -> None:
        async def op(conn: AsyncConnection) -> int:
            stmt = text("UPDATE items SET lease_expires = :e WHERE lease_id = :l AND state = 1")
            return int((await conn.execute(stmt, {"e": expires, "l": lease_id})).rowcount)

        def after(n: int) -> None:
            lease = self.m.leases.get(lease_id)
            if lease is not None and n:
                lease.expires_at = expires

        await self.db.write(op, after)

    @staticmethod
    def _sort_key(row: Any) -> tuple[float, float, int]:
        # claimed rows are (id, priority, payload, entered_at); by index: no name lookup
        return (0.0, 0.0, row[0])

    async def _claim_op(
        self, conn: AsyncConnection, lease_id: str, lease_len: float, n: int, min_version: int, reader: str
    ) -> Claimed:
        now = time.time()
        expires = now + lease_len
        reaped = {lid: lease.count for lid, lease in self.m.leases.items() if lease.expires_at <= now}
        if reaped:
            await conn.execute(
                text(
                    "UPDATE items SET state = 0, lease_id = NULL, lease_expires = NULL, use_count = max(use_count - 1, 0) "
                    "WHERE state = 1 AND lease_expires <= :now"
                ),
                {"now": now},
            )
        dropped = 0
        if min_version:
            res = await conn.execute(
                text("DELETE FROM items WHERE state = 0 AND ready_at <= :now AND model_version < :v"),
                {"now": now, "v": min_version},
            )
            dropped = res.rowcount
        dropped += await self._settle(conn, now)
        await bump(conn, dropped=dropped)
        claim = text(
            "UPDATE items SET state = 1, lease_id = :lease, lease_expires = :exp, leased_at = :now, "
            "leased_by = :reader, use_count = use_count + 1 "
            f"WHERE id IN (SELECT id FROM items WHERE state = 0 AND ready_at <= :now ORDER BY {self.order_by} LIMIT :n) "
            f"RETURNING id, priority, {s.ENTERED_AT}"
        )
        params = {"lease": lease_id, "exp": expires, "now": now, "reader": reader or None, "n": n}
        claimed = (await conn.execute(claim, params)).all()
        rows = await with_payloads(conn, claimed)
        await bump(conn, read=len(rows))
        return Claimed(rows, reaped, dropped, lease_id, expires, now, reader)

    def _after_claim(self, c: Claimed) -> None:
        back = sum(c.reaped.values())
        for lid in c.reaped:
            self.m.leases.pop(lid, None)
        if c.rows:
            lease = self.m.leases.setdefault(c.lease_id, Lease(c.expires, 0, c.reader))
            lease.count += len(c.rows)
        self.m.leased += len(c.rows) - back
        self.m.ready += back - len(c.rows) - c.dropped
        self.m.counters["read"] += len(c.rows)
        self.m.counters["dropped"] += c.dropped
        if back or c.dropped:
            self._notify()

    # ---- ack / nack --------------------------------------------------------------------
    def _live_lease(self, lease_id: str) -> Lease:
        lease = self.m.leases.get(lease_id)
        if lease is None:
            raise NotFound(
                f"lease {lease_id!r} is unknown, already acked/nacked, or expired and reclaimed",
                field="lease_id",
            )
        if lease.expires_at <= time.time():
            raise FailedPrecondition(
                f"lease {lease_id!r} expired at {lease.expires_at:.3f}; its items are readable again — read them anew",
                field="lease_id",
            )
        return lease

    async def ack(self, lease_id: str) -> int:
        """Consume (fifo), cool down (priority) or mark read (table) the lease's items."""
        lease = self._live_lease(lease_id)

        async def op(conn: AsyncConnection) -> tuple[int, int, list[float]]:
            acked, back, ready_ats = await self._ack_rows(conn, lease_id, time.time())
            if acked != lease.count:
                raise FailedPrecondition(
                    f"lease {lease_id!r} expired before the ack committed", field="lease_id"
                )
            await bump(conn, acked=acked)
            return acked, back, ready_ats

        def after(out: tuple[int, int, list[float]]) -> None:
            acked, back, ready_ats = out
            self.m.leases.pop(lease_id, None)
            self.m.leased -= acked
            self.m.ready += back
            for t in ready_ats:
                self.m.cooling[t] = self.m.cooling.get(t, 0) + 1
            self.m.counters["acked"] += acked
            self._notify()

        return (await self.db.write(op, after))[0]

    async def nack(self, lease_id: str) -> int:
        """Make the lease's items readable again at once (not counted as used)."""
        self._live_lease(lease_id)
        return await self._give_back([lease_id])

    async def nack_reader(self, reader_id: str) -> int:
        """Give back every lease `reader_id` holds, expired ones included; returns the rows made readable.

        For a restarted reader: its predecessor may have died after the buffer committed a lease
        but before it learnt (or recorded) the lease id. A lease the same reader takes while this
        call waits for the writer is not included."""
        if not reader_id:
            raise InvalidArgument("reader_id must not be empty", field="reader_id")
        held = [lid for lid, lease in self.m.leases.items() if lease.reader == reader_id]
        return await self._give_back(held) if held else 0

    async def _give_back(self, lease_ids: list[str]) -> int:
        """Put the rows still under these leases back in READY; returns how many."""

        async def op(conn: AsyncConnection) -> int:
            res = await conn.execute(
                text(
                    "UPDATE items SET state = 0, lease_id = NULL, lease_expires = NULL, "
                    "use_count = max(use_count - 1, 0) WHERE lease_id IN :leases AND state = 1"
                ).bindparams(bindparam("leases", expanding=True)),
                {"leases": lease_ids},
            )
            return int(res.rowcount)

        def after(n: int) -> None:
            for lid in lease_ids:
                self.m.leases.pop(lid, None)
            self.m.leased -= n
            self.m.ready += n
            self._notify()

        return int(await self.db.write(op, after))
