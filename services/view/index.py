"""The viewer's own SQLite index of a run's experiences.

A buffer keeps each experience as the protobuf bytes its writer sent plus the columns its reads
order by (services/buffer/storage/schema.py): nothing to filter a page by reward, step or task
without decoding every row. The viewer therefore copies what it needs into a file of its own
(default `<run dir>/view/index.sqlite`): one row per experience with the columns the filters use,
indexed, and the payload beside it. The buffer's files are opened read-only and never changed.

`sync` is incremental: per buffer file it reads the items after the last id it copied (a file
that was replaced, seen by its inode or a smaller largest id, is copied afresh), and per stage it
reads the trainer's progress.jsonl from the byte it stopped at, to record which trainer step
trained each row (its `rows` keys are `<batch_id>/<task_id>/<run_id>`). A fifo buffer deletes
rows once the trainer acks them: rows the viewer saw before that stay in its index, rows it never
saw are not there (a `storage_type: sql` experience buffer keeps every row).

A group (`group_id`: one task's rollouts in one explorer step) is flat when it has more than one
row and every reward in it is equal: it carries no signal for group-relative advantages.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from services.common.errors import FailedPrecondition
from services.view.run_dir import BufferFile, Run, Stage, open_readonly
from trinity_grpc.common.v1 import common_pb2 as pb

SCHEMA = """
CREATE TABLE IF NOT EXISTS sources (
    id INTEGER PRIMARY KEY,
    stage TEXT NOT NULL,
    buffer TEXT NOT NULL,
    kind TEXT NOT NULL,
    path TEXT NOT NULL UNIQUE,
    inode INTEGER NOT NULL,
    last_item INTEGER NOT NULL DEFAULT 0,
    undecodable INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS rows (
    id INTEGER PRIMARY KEY,
    source INTEGER NOT NULL,
    item INTEGER NOT NULL,
    stage TEXT NOT NULL,
    buffer TEXT NOT NULL,
    step INTEGER NOT NULL,
    model_version INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    group_id TEXT NOT NULL,
    reward REAL,
    prompt_tokens INTEGER NOT NULL,
    response_tokens INTEGER NOT NULL,
    created_at REAL NOT NULL,
    trained_step INTEGER,
    flat INTEGER NOT NULL DEFAULT 0,
    UNIQUE (source, item)
);
CREATE TABLE IF NOT EXISTS payloads (id INTEGER PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS trained (
    stage TEXT NOT NULL,
    step INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    trained_step INTEGER NOT NULL,
    PRIMARY KEY (stage, step, task_id, run_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS progress (
    stage TEXT PRIMARY KEY,
    inode INTEGER NOT NULL,
    offset INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_rows_stage ON rows (stage);
CREATE INDEX IF NOT EXISTS ix_rows_step ON rows (stage, step, reward);
CREATE INDEX IF NOT EXISTS ix_rows_reward ON rows (stage, reward);
CREATE INDEX IF NOT EXISTS ix_rows_task ON rows (stage, task_id, step, run_id);
CREATE INDEX IF NOT EXISTS ix_rows_group ON rows (stage, group_id);
CREATE INDEX IF NOT EXISTS ix_rows_flat ON rows (stage, flat);
"""

# Items copied per read transaction on a buffer file: bounds how long the viewer holds a read
# snapshot of a live buffer (and its memory) while the index catches up.
CHUNK = 2000


def array_length(arr: pb.Array) -> int:
    """Elements in an Array without decoding it."""
    if arr.raw:
        size = {pb.ELEMENT_TYPE_INT32: 4, pb.ELEMENT_TYPE_INT64: 8, pb.ELEMENT_TYPE_FLOAT32: 4}.get(
            arr.dtype, 8
        )
        return len(arr.raw) // (1 if arr.dtype == pb.ELEMENT_TYPE_BOOL else size)
    return len(arr.int_values) + len(arr.float_values)


@dataclass
class SyncReport:
    """What one sync added."""

    rows: int = 0
    trained: int = 0
    undecodable: int = 0
    errors: list[str] = field(default_factory=list)


def _row_values(
    source: int, stage: str, buffer: str, item: int, created: float, msg: pb.Experience
) -> tuple[Any, ...]:
    tokens = array_length(msg.tokens)
    prompt = int(msg.prompt_length)
    return (
        source,
        item,
        stage,
        buffer,
        int(msg.ids.batch_id),
        int(msg.model_version),
        msg.ids.task_id,
        int(msg.ids.run_id),
        msg.ids.group_id,
        msg.reward if msg.HasField("reward") else None,
        prompt,
        max(tokens - prompt, 0),
        created,
    )


def split_key(key: str) -> tuple[int, str, int] | None:
    """`[<producer>:]<batch_id>/<task_id>/<run_id>` (the trainer's progress row keys; task ids may
    hold '/'). The producing explorer is not matched: the index's rows do not record it, so with
    several explorers two rows can share a trained-at step."""
    head, _, rest = key.partition("/")
    head = head.rpartition(":")[2]
    task, _, run = rest.rpartition("/")
    try:
        return int(head), task, int(run)
    except ValueError:
        return None


class ExperienceIndex:
    """The index file; `sync(run)` brings it up to date. Safe to read from other connections."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._connect()
            self._conn.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise FailedPrecondition(
                f"cannot open the viewer's index {self.path}: {exc} (give --index PATH somewhere writable)",
                field="index",
            ) from exc

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def reader(self) -> sqlite3.Connection:
        """A new read connection (one per request thread)."""
        uri = self.path.absolute().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def count(self) -> int:
        """Rows in the index."""
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM rows").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def sync(self, run: Run) -> SyncReport:
        report = SyncReport()
        with self._lock:
            for stage in run.stages:
                for buf in stage.buffer_files():
                    try:
                        self._sync_buffer(stage, buf, report)
                    except sqlite3.DatabaseError as exc:
                        report.errors.append(f"{buf.path}: {exc}")
                self._sync_progress(stage, report)
        return report

    # ---- buffers -----------------------------------------------------------------------------
    def _source(self, stage: Stage, buf: BufferFile) -> tuple[int, int]:
        """(source id, last item copied); a file replaced since the last sync starts over."""
        inode = os.stat(buf.path).st_ino
        row = self._conn.execute(
            "SELECT id, inode, last_item FROM sources WHERE path = ?", (str(buf.path),)
        ).fetchone()
        if row is not None and row[1] == inode:
            return int(row[0]), int(row[2])
        if row is not None:
            self._forget(int(row[0]))
        cur = self._conn.execute(
            "INSERT INTO sources (stage, buffer, kind, path, inode) VALUES (?, ?, ?, ?, ?)",
            (stage.name, buf.name, buf.kind, str(buf.path), inode),
        )
        return int(cur.lastrowid or 0), 0

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _forget(self, source: int) -> None:
        with self._transaction():
            self._conn.execute(
                "DELETE FROM payloads WHERE id IN (SELECT id FROM rows WHERE source = ?)", (source,)
            )
            self._conn.execute("DELETE FROM rows WHERE source = ?", (source,))
            self._conn.execute("DELETE FROM sources WHERE id = ?", (source,))

    def _sync_buffer(self, stage: Stage, buf: BufferFile, report: SyncReport) -> None:
        source, last = self._source(stage, buf)
        src = open_readonly(buf.path)
        try:
            newest = src.execute("SELECT max(id) FROM items").fetchone()[0]
            if newest is not None and int(newest) < last:  # same inode, fewer rows: recreated in place
                self._forget(source)
                source, last = self._source(stage, buf)
            while True:
                chunk = src.execute(
                    "SELECT i.id, i.created_at, p.payload FROM items AS i JOIN payloads AS p ON p.id = i.id "
                    "WHERE i.id > ? ORDER BY i.id LIMIT ?",
                    (last, CHUNK),
                ).fetchall()
                if not chunk:
                    return
                self._insert(stage, buf, source, chunk, report)
                last = int(chunk[-1][0])
        finally:
            src.close()

    def _insert(
        self, stage: Stage, buf: BufferFile, source: int, chunk: list[Any], report: SyncReport
    ) -> None:
        values, payloads, bad = [], [], 0
        for item, created, payload in chunk:
            try:
                msg = pb.Experience.FromString(payload)
            except DecodeError:
                bad += 1
                continue
            values.append(_row_values(source, stage.name, buf.name, int(item), float(created), msg))
            payloads.append(payload)
        with self._transaction() as conn:
            groups: set[str] = set()
            for row, payload in zip(values, payloads, strict=True):
                cur = conn.execute(
                    "INSERT OR IGNORE INTO rows (source, item, stage, buffer, step, model_version, task_id, "
                    "run_id, group_id, reward, prompt_tokens, response_tokens, created_at, trained_step) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT trained_step FROM trained AS t "
                    "WHERE t.stage = ?3 AND t.step = ?5 AND t.task_id = ?7 AND t.run_id = ?8))",
                    row,
                )
                if cur.rowcount:
                    conn.execute("INSERT INTO payloads (id, payload) VALUES (?, ?)", (cur.lastrowid, payload))
                    groups.add(row[8])
                    report.rows += 1
            self._mark_flat(stage.name, groups)
            conn.execute(
                "UPDATE sources SET last_item = ?, undecodable = undecodable + ? WHERE id = ?",
                (int(chunk[-1][0]), bad, source),
            )
        report.undecodable += bad

    def _mark_flat(self, stage: str, groups: Iterable[str]) -> None:
        self._conn.executemany(
            "UPDATE rows SET flat = (SELECT count(*) > 1 AND count(reward) = count(*) AND min(reward) = max(reward) "
            "FROM rows AS g WHERE g.stage = rows.stage AND g.group_id = rows.group_id) "
            "WHERE stage = ? AND group_id = ?",
            [(stage, g) for g in groups if g],
        )

    # ---- trainer progress ----------------------------------------------------------------------
    def _sync_progress(self, stage: Stage, report: SyncReport) -> None:
        path = stage.path / "trainer" / "progress.jsonl"
        try:
            inode = os.stat(path).st_ino
        except OSError:
            return
        row = self._conn.execute(
            "SELECT inode, offset FROM progress WHERE stage = ?", (stage.name,)
        ).fetchone()
        offset = int(row[1]) if row is not None and row[0] == inode else 0
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next sync
        updates = []
        for line in data[:end].splitlines():
            record = _json(line)
            if record is None or not isinstance(record.get("rows"), list):
                continue
            for key in record["rows"]:
                parts = split_key(str(key))
                if parts is not None:
                    updates.append((int(record["step"]), stage.name, *parts))
        with self._transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO trained (trained_step, stage, step, task_id, run_id) VALUES (?, ?, ?, ?, ?)",
                updates,
            )
            cur = conn.executemany(
                "UPDATE rows SET trained_step = ? WHERE stage = ? AND step = ? AND task_id = ? AND run_id = ?",
                updates,
            )
            report.trained += max(cur.rowcount, 0)
            conn.execute(
                "INSERT INTO progress (stage, inode, offset) VALUES (?, ?, ?) "
                "ON CONFLICT (stage) DO UPDATE SET inode = excluded.inode, offset = excluded.offset",
                (stage.name, inode, offset + end),
            )


def _json(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
