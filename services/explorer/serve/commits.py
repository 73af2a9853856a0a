"""Committed groups into the experience buffer, exactly once, and the sweep of expired sessions.

A group's rows are rebuilt from the history (the same rows every time) and written under the
idempotency key `serve:<explorer>:<group key>:part<j>` (j: a chunk of buffer.max_batch_items), then
marked written. A proxy killed between the two writes them again at start: the buffer takes the
retried write as a no-op. A write the buffer refuses for now (it restarts) stays pending and is
retried at the next sweep; the commit that made the group was acknowledged already.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from services.common.errors import TrinityError
from services.common.logging import get_logger
from services.explorer.serve import feedback as F
from services.explorer.serve.history import History

log = get_logger("explorer.serve.commits")


class Commits:
    """/feedback and /commit over the history, and the writes they lead to."""

    def __init__(
        self,
        history: History,
        buffer: Any,
        *,
        buffer_name: str,
        producer: str,
        group_size: int,
        ttl_s: float,
        chunk: int,
        trained: tuple[float, float, int] = (1.0, 1.0, 0),
    ) -> None:
        self.history = history
        self.buffer = buffer
        self.buffer_name = buffer_name
        self.producer = producer
        self.group_size = group_size
        self.ttl_s = ttl_s
        self.chunk = max(1, chunk)
        self.trained = trained  # (temperature, top_p, top_k) the trainer takes logprobs under
        self._write_lock = asyncio.Lock()

    async def feedback(self, body: Any) -> dict[str, Any]:
        return await self.history.run(F.apply_feedback, F.parse_feedback(body), time.time())

    async def commit(self, body: Any) -> dict[str, Any]:
        request = F.parse_commit(body)
        reply, keys = await self.history.run(F.commit, request, self.group_size, time.time(), self.trained)
        written = await self.write_groups(keys)
        for item in reply["committed"]:
            key = item["group"]
            item["group_state"] = None if key is None else ("written" if key in written else "pending")
        return reply

    async def write_groups(self, keys: list[str]) -> set[str]:
        """Write each group; returns the keys now in the buffer (others stay pending, retried)."""
        done: set[str] = set()
        if not keys:  # most commits complete no group: they need not wait for the writes of others
            return done
        async with self._write_lock:
            for key in keys:
                try:
                    await self._write(key)
                except TrinityError as exc:
                    log.warning("serve_group_write_deferred", group=key, error=str(exc))
                    continue
                done.add(key)
        return done

    async def _write(self, key: str) -> None:
        # a commit's write and the sweep's flush may both hold a key: whichever comes second skips it
        if await self.history.run(F.group_written, key):
            return
        rows = await self.history.run(F.group_experiences, key, self.producer)
        for part, start in enumerate(range(0, len(rows), self.chunk)):
            await self.buffer.write(
                self.buffer_name,
                rows[start : start + self.chunk],
                idempotency_key=f"serve:{self.producer}:{key}:part{part}",
                writer_id=self.producer,
            )
        await self.history.run(F.mark_written, key)
        log.info("serve_group_written", group=key, rows=len(rows))

    async def flush(self) -> set[str]:
        """Write every group still pending (at start, and at each sweep)."""
        return await self.write_groups(await self.history.run(F.pending_groups))

    async def sweep(self) -> int:
        """Expire idle sessions, write groups that waited too long, retry pending writes."""
        expired, _keys = await self.history.run(F.expire, time.time(), self.ttl_s, self.group_size)
        if expired:
            log.info("serve_sessions_expired", sessions=expired)
        await self.flush()
        return expired

    async def stats(self) -> dict[str, Any]:
        return await self.history.run(F.stats)
