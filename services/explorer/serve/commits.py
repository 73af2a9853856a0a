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
        self._writing: dict[str, asyncio.Future[None]] = {}  # group key -> its write under way

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
        """Write each group; returns the keys now in the buffer (others stay pending, retried).
        Different groups are written at once (a commit waits for its own group only); a group whose
        write is under way (a commit's write and the sweep's flush) is awaited, not written again."""
        done: set[str] = set()
        for key in keys:
            try:
                await self._write_once(key)
            except TrinityError as exc:
                log.warning("serve_group_write_deferred", group=key, error=str(exc))
                continue
            done.add(key)
        return done

    def _write_once(self, key: str) -> asyncio.Future[None]:
        running = self._writing.get(key)
        if running is None:
            running = self._writing[key] = asyncio.ensure_future(self._write(key))
            running.add_done_callback(lambda _done: self._writing.pop(key, None))
        return asyncio.shield(running)  # a caller that goes away does not stop the write

    async def _write(self, key: str) -> None:
        # a sweep that found the group pending before a commit's write of it ended: nothing to do
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
