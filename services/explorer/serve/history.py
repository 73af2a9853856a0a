"""The proxy's durable record (explorer.db_url, SQLite): sessions, turns, rewards, groups, request
keys, counters.

Everything a response or an acknowledgement promised is here before the HTTP answer leaves, so
a proxy killed and restarted continues sessions, still knows every reward, and writes every
committed group (WAL, synchronous NORMAL: it survives a crash of the process). Calls run one at a
time on one thread, each in a `BEGIN IMMEDIATE` transaction (SQLAlchemy's recipe for pysqlite),
so a check and the change it allows are atomic. The rules live in feedback.py and core.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import sqlalchemy as sa

from services.explorer.serve.chains import Turn

T = TypeVar("T")
META = sa.MetaData()
SESSIONS = sa.Table(
    "sessions",
    META,
    sa.Column("session_id", sa.String, primary_key=True),
    sa.Column("state", sa.String, nullable=False),  # open | committed | expired
    sa.Column("task_id", sa.String),
    sa.Column("reward", sa.Float),
    sa.Column("splits", sa.Integer, nullable=False, default=0),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("last_active", sa.Float, nullable=False),
    sa.Column("committed_at", sa.Float),
    sa.Column("group_key", sa.String, index=True),
    sa.Column("experiences", sa.Integer, nullable=False, default=0),
    sa.Column("unrewarded", sa.Integer, nullable=False, default=0),
)
TURNS = sa.Table(
    "turns",
    META,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("turn_id", sa.String, unique=True, nullable=False),
    sa.Column("response_id", sa.String, index=True, nullable=False),
    sa.Column("session_id", sa.String, index=True, nullable=False),
    sa.Column("parent_id", sa.String),
    sa.Column("prompt_ids", sa.LargeBinary, nullable=False),
    sa.Column("response_ids", sa.LargeBinary, nullable=False),
    sa.Column("logprobs", sa.LargeBinary, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("context_text", sa.Text, nullable=False),
    sa.Column("reply_text", sa.Text, nullable=False),
    sa.Column("reply_open_text", sa.Text),
    sa.Column("response_text", sa.Text, nullable=False),
    sa.Column("finish_reason", sa.String, nullable=False),
    sa.Column("messages", sa.Text, nullable=False),
    sa.Column("temperature", sa.Float, nullable=False),
    sa.Column("top_p", sa.Float, nullable=False),
    sa.Column("top_k", sa.Integer, nullable=False),
)
REWARDS = sa.Table(
    "response_rewards",
    META,
    sa.Column("response_id", sa.String, primary_key=True),
    sa.Column("session_id", sa.String, index=True, nullable=False),
    sa.Column("reward", sa.Float, nullable=False),
    # the /feedback call that gave it (chains.ResponseReward); NULL in histories from before it existed
    sa.Column("feedback_id", sa.String),
)
GROUPS = sa.Table(
    "groups",
    META,
    sa.Column("group_key", sa.String, primary_key=True),
    sa.Column("task_id", sa.String, index=True, nullable=False),
    sa.Column("state", sa.String, nullable=False),  # pending (to write) | written
    sa.Column("sessions", sa.Integer, nullable=False),
    sa.Column("rows", sa.Integer, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
)
# Idempotency-Key of a completion request -> the response recorded for it: a retried request (the
# answer lost to a crash or a timeout) gets that response again instead of a second sample.
REQUEST_KEYS = sa.Table(
    "request_keys",
    META,
    sa.Column("key", sa.String, primary_key=True),
    sa.Column("session_id", sa.String, nullable=False),
    sa.Column("response_id", sa.String, nullable=False),
    sa.Column("context_sha256", sa.String, nullable=False),  # of the request's rendered conversation
)
COUNTERS = sa.Table(
    "counters",
    META,
    sa.Column("name", sa.String, primary_key=True),
    sa.Column("value", sa.Integer, nullable=False),
)


def default_db_url(run_dir: str) -> str:
    return f"sqlite:///{os.path.join(run_dir, 'serve', 'proxy_history.db')}"


def turn_row(turn: Turn) -> dict[str, Any]:
    return {
        "turn_id": turn.turn_id,
        "response_id": turn.response_id,
        "session_id": turn.session_id,
        "parent_id": turn.parent_id,
        "prompt_ids": np.asarray(turn.prompt_ids, dtype=np.int64).tobytes(),
        "response_ids": np.asarray(turn.response_ids, dtype=np.int64).tobytes(),
        "logprobs": np.asarray(turn.logprobs, dtype=np.float32).tobytes(),
        "version": turn.version,
        "context_text": turn.context_text,
        "reply_text": turn.reply_text,
        "reply_open_text": turn.reply_open_text,
        "response_text": turn.response_text,
        "finish_reason": turn.finish_reason,
        "messages": json.dumps(turn.messages),
        "temperature": turn.sampling[0],
        "top_p": turn.sampling[1],
        "top_k": turn.sampling[2],
    }


def turn_of(row: Any) -> Turn:
    return Turn(
        turn_id=row.turn_id,
        response_id=row.response_id,
        session_id=row.session_id,
        parent_id=row.parent_id,
        prompt_ids=np.frombuffer(row.prompt_ids, dtype=np.int64),
        response_ids=np.frombuffer(row.response_ids, dtype=np.int64),
        logprobs=np.frombuffer(row.logprobs, dtype=np.float32),
        version=row.version,
        context_text=row.context_text,
        reply_text=row.reply_text,
        reply_open_text=row.reply_open_text,
        response_text=row.response_text,
        finish_reason=row.finish_reason,
        messages=json.loads(row.messages),
        sampling=(row.temperature, row.top_p, row.top_k),
    )


def load_turns(conn: sa.Connection, session_id: str) -> list[Turn]:
    rows = conn.execute(sa.select(TURNS).where(TURNS.c.session_id == session_id).order_by(TURNS.c.seq))
    return [turn_of(r) for r in rows]


def response_turns(conn: sa.Connection, response_id: str) -> list[Turn]:
    """The turns (choices) of one response, in choice order."""
    rows = conn.execute(sa.select(TURNS).where(TURNS.c.response_id == response_id).order_by(TURNS.c.seq))
    return [turn_of(r) for r in rows]


def session_row(conn: sa.Connection, session_id: str) -> Any:
    return conn.execute(sa.select(SESSIONS).where(SESSIONS.c.session_id == session_id)).first()


def bump(conn: sa.Connection, name: str, by: int = 1) -> None:
    """Add `by` to a counter (created at 0)."""
    if by == 0:
        return
    stmt = sa.text(
        "INSERT INTO counters (name, value) VALUES (:name, :by) "
        "ON CONFLICT(name) DO UPDATE SET value = value + :by"
    )
    conn.execute(stmt, {"name": name, "by": by})


def counters(conn: sa.Connection) -> dict[str, int]:
    return {r.name: int(r.value) for r in conn.execute(sa.select(COUNTERS))}


class History:
    """The store behind explorer.db_url; `run(fn, *args)` calls fn(conn, *args) in one transaction."""

    def __init__(self, url: str) -> None:
        if url.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(os.path.abspath(url[len("sqlite:///") :])), exist_ok=True)
        self.url = url
        self.engine = sa.create_engine(url)
        sa.event.listen(self.engine, "connect", _on_connect)
        sa.event.listen(self.engine, "begin", _on_begin)
        META.create_all(self.engine)
        _add_missing_columns(self.engine)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="serve-history")

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(conn, *args) in one transaction, on the calling thread (tests, start-up)."""
        with self.engine.begin() as conn:
            return fn(conn, *args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(conn, *args) in one transaction on the store's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(self.call, fn, *args))

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.engine.dispose()


def _add_missing_columns(engine: sa.Engine) -> None:
    """Bring a history written by an older proxy up to the tables above (nullable columns only)."""
    inspector = sa.inspect(engine)
    for table in META.sorted_tables:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in have:
                if not column.nullable:
                    raise RuntimeError(f"{engine.url}: table {table.name} lacks the column {column.name}")
                kind = column.type.compile(engine.dialect)
                with engine.begin() as conn:
                    conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}")


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # transactions are begun explicitly, below
    dbapi_conn.execute("PRAGMA journal_mode=WAL")
    dbapi_conn.execute("PRAGMA synchronous=NORMAL")


def _on_begin(conn: sa.Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")
