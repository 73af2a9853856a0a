"""One SQLite database file behind SQLAlchemy's asyncio layer, with a single writer task.

Why a single writer: SQLite allows one writer at a time, and SQLAlchemy's asyncio layer costs
about 1 ms per transaction here, so concurrent callers are better served by *group commit*: the
writer task takes every operation queued while the previous transaction ran and executes them
in one transaction (one fsync-free WAL commit). An operation is a coroutine function over the
connection (`op(conn) -> result`) plus an optional `after(result)` callback that the writer
runs right after the commit, so in-memory state changes exactly when the database does, even
when the caller has been cancelled meanwhile. If a grouped transaction fails, its operations are
retried one per transaction so one bad operation cannot fail its neighbours; operations must
therefore only touch the database (their side effects belong in `after`).

Pure reads (scans, stats) go through a separate read-only engine: WAL lets them run beside
the writer. WAL + synchronous=NORMAL keeps every committed transaction through a process crash
(SIGKILL); only a power loss may drop the last commits.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import MetaData, event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

Op = Callable[[AsyncConnection], Awaitable[Any]]
After = Callable[[Any], None]

# Operations grouped into one transaction at most; bounds the latency a slow group adds.
MAX_GROUP = 64


@dataclass
class _Pending:
    op: Op
    after: After | None
    future: asyncio.Future[Any]


def _make_engine(path: str, *, begin: str) -> AsyncEngine:
    """An engine on one connection with WAL and our own BEGIN (SQLAlchemy's documented recipe:
    pysqlite's implicit transactions are switched off and we emit BEGIN ourselves)."""
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}", poolclass=StaticPool)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)

    return engine


class Database:
    """A SQLite file: `write(op)` through the writer task, `read(op)` on the read engine."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._writer_engine: AsyncEngine | None = None
        self._reader_engine: AsyncEngine | None = None
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def open(self, metadata: MetaData) -> None:
        """Create the file and tables if needed and start the writer task."""
        _make_parent(self.path)
        self._writer_engine = _make_engine(self.path, begin="BEGIN IMMEDIATE")
        self._reader_engine = _make_engine(self.path, begin="BEGIN")
        async with self._writer_engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        self._task = asyncio.create_task(self._run(), name=f"sqlite-writer:{os.path.basename(self.path)}")

    async def write(self, op: Op, after: After | None = None) -> Any:
        """Run `op` in a write transaction; returns its result once the transaction committed."""
        if self._closed:
            from services.common.errors import Unavailable

            raise Unavailable(f"database {self.path} is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(op, after, future))
        return await asyncio.shield(future)

    async def read(self, op: Op) -> Any:
        """Run `op` in a read transaction on the read engine (sees every committed write)."""
        assert self._reader_engine is not None
        async with self._reader_engine.connect() as conn:
            return await op(conn)

    async def close(self) -> None:
        """Finish queued operations, stop the writer, close both engines."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._queue.put_nowait(None)
            await self._task
        for engine in (self._writer_engine, self._reader_engine):
            if engine is not None:
                await engine.dispose()

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            if first is None:
                return
            group = [first]
            stop = False
            while len(group) < MAX_GROUP and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stop = True
                    break
                group.append(item)
            await self._commit_group(group)
            if stop:
                return

    async def _commit_group(self, group: list[_Pending]) -> None:
        assert self._writer_engine is not None
        try:
            async with self._writer_engine.begin() as conn:
                results = [await p.op(conn) for p in group]
        except Exception as exc:
            if len(group) == 1:
                _settle(group[0], None, exc)
                return
            for pending in group:  # isolate the failing operation
                await self._commit_group([pending])
            return
        for pending, result in zip(group, results, strict=True):
            _settle(pending, result, None)


def _make_parent(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def _settle(pending: _Pending, result: Any, exc: BaseException | None) -> None:
    if exc is None and pending.after is not None:
        try:
            pending.after(result)
        except Exception as after_exc:  # a bug in a callback must not kill the writer
            exc = after_exc
    if pending.future.done():
        return
    if exc is not None:
        pending.future.set_exception(exc)
    else:
        pending.future.set_result(result)
