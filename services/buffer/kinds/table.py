"""Table: a persistent, re-readable store of experiences (SFT / DPO data, audit of all writes).

Read leases unread rows in arrival order and Ack marks them read (they stay). ScanTable reads
any rows from an offset without leases. Row positions are stable because rows are never deleted:
position p is the row with id p + 1.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.buffer.kinds.items import ItemBuffer


class TableBuffer(ItemBuffer):
    kind = "table"
    order_by = "id"

    async def _ack_rows(
        self, conn: AsyncConnection, lease_id: str, now: float
    ) -> tuple[int, int, list[float]]:
        res = await conn.execute(
            text(
                "UPDATE items SET state = 2, lease_id = NULL, lease_expires = NULL WHERE lease_id = :lease AND state = 1"
            ),
            {"lease": lease_id},
        )
        return int(res.rowcount), 0, []

    async def scan(self, offset: int, limit: int) -> tuple[list[bytes], int]:
        async def q(conn: AsyncConnection) -> list[tuple[int, bytes]]:
            stmt = text(
                "SELECT i.id, p.payload FROM items AS i JOIN payloads AS p ON p.id = i.id "
                "WHERE i.id > :offset ORDER BY i.id LIMIT :limit"
            )
            return [
                (int(i), p) for i, p in (await conn.execute(stmt, {"offset": offset, "limit": limit})).all()
            ]

        rows = await self.db.read(q)
        return [p for _, p in rows], (rows[-1][0] if rows else offset)
