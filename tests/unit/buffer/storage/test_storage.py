"""Storage layout of experience buffers: payloads in their own table, written once, deleted with
their item; ids never reused; files from before the split are migrated on open."""

from __future__ import annotations

import sqlite3

import numpy as np

from services.buffer.core import BufferCore, Defaults
from services.buffer.types import BufferSpec
from services.common.experience import Experience
from services.common.wire import experience_to_proto
from trinity_grpc.common.v1 import common_pb2 as pb


def exp(label: str, version: int = 0) -> pb.Experience:
    return experience_to_proto(
        Experience(tokens=np.arange(5, dtype=np.int32), prompt_length=1, model_version=version, task_id=label)
    )


def labels(payloads: list[bytes]) -> list[str]:
    return [pb.Experience.FromString(p).ids.task_id for p in payloads]


def count(path: str, sql: str) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute(sql).fetchone()[0])


async def test_payloads_are_deleted_with_their_items_and_ids_are_not_reused(tmp_path):
    core = BufferCore(str(tmp_path))
    await core.start([BufferSpec("q", "fifo")])
    path = str(tmp_path / "q.sqlite")
    await core.write("q", [exp("a"), exp("b"), exp("c")])
    first = await core.read("q", 3, max_wait=0)
    assert await core.ack(first.lease_id) == 3
    await core.write("q", [exp("d")])
    second = await core.read("q", 5, max_wait=0)
    assert labels(second.payloads) == ["d"]
    await core.close()
    assert count(path, "SELECT count(*) FROM payloads") == 1  # only d's
    assert count(path, "SELECT id FROM items") == 4  # after the deleted 1..3, not 1 again


LEGACY = """
CREATE TABLE items (
    id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, state INTEGER NOT NULL, model_version INTEGER NOT NULL,
    priority FLOAT NOT NULL, use_count INTEGER NOT NULL, ready_at FLOAT NOT NULL, created_at FLOAT NOT NULL,
    lease_id VARCHAR, lease_expires FLOAT, payload BLOB NOT NULL);
CREATE INDEX ix_items_lease ON items (lease_id) WHERE lease_id IS NOT NULL;
CREATE INDEX ix_items_ready_fifo ON items (id) WHERE state = 0;
"""


async def test_file_with_payloads_inside_items_is_migrated(tmp_path):
    """A buffer file written before payloads moved to their own table keeps its items."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(LEGACY)
        db.executemany(
            "INSERT INTO items (state, model_version, priority, use_count, ready_at, created_at, payload) "
            "VALUES (0, ?, 0, 0, 0, 0, ?)",
            [(i, exp(label, i).SerializeToString()) for i, label in enumerate(["x", "y", "z"])],
        )
        db.execute("DELETE FROM items WHERE id = 3")  # z was consumed; its id must stay unused
    core = BufferCore(str(tmp_path), Defaults(lease_s=30))
    await core.start([BufferSpec("old", "fifo")])
    await core.write("old", [exp("new", 5)])
    got = await core.read("old", 10, max_wait=0)
    assert labels(got.payloads) == ["x", "y", "new"]
    assert (await core.stats("old")).per_model_version == {0: 1, 1: 1, 5: 1}
    assert await core.ack(got.lease_id) == 3
    await core.close()
    with sqlite3.connect(path) as db:
        columns = [r[1] for r in db.execute("PRAGMA table_info(items)")]
    assert "payload" not in columns
    assert {"leased_at", "leased_by"} <= set(columns)  # columns added since that layout
    assert count(str(path), "SELECT count(*) FROM payloads") == 0
    assert count(str(path), "SELECT seq FROM sqlite_sequence WHERE name = 'items'") == 4


async def test_keys_of_a_file_from_before_content_digests_still_answer_duplicate(tmp_path):
    """write_keys without content_hash (the layout before issue 22): the column is added on open;
    an old key's content is unknown, so any resend under it stays a duplicate, as it was."""
    path = tmp_path / "keys.sqlite"
    core = BufferCore(str(tmp_path))
    await core.start([BufferSpec("keys", "fifo")])
    await core.write("keys", [exp("a")], key="old")
    await core.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE write_keys DROP COLUMN content_hash")
    core = BufferCore(str(tmp_path))
    await core.start([BufferSpec("keys", "fifo")])
    assert (await core.write("keys", [exp("other")], key="old")).duplicate
    assert (await core.write("keys", [exp("b")], key="new")).written == 1
    await core.close()
    with sqlite3.connect(path) as db:
        hashes = dict(db.execute("SELECT key, content_hash FROM write_keys"))
    assert hashes["old"] is None and len(hashes["new"]) == 20  # SHA-1
    assert count(str(path), "SELECT count(*) FROM items") == 2
