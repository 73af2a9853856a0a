"""Tables of a buffer's SQLite file (SQLAlchemy Core). Every buffer has its own file.

Experience buffers keep each Experience as the protobuf bytes the writer sent, plus the few
columns that reads order and filter by, so a read never decodes or re-encodes an item. The bytes
live in their own table (`payloads`, same id) and are written once: claims, acks and cooldowns
rewrite only the narrow `items` rows. (With the bytes in `items`, every claim rewrote each
~4 KB row, its page and the WAL copy of it: ~1.7x the bytes written per experience.)
"""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, LargeBinary, MetaData, String, Table, text

metadata = MetaData()

# Item states. READY includes priority items cooling down (ready_at in the future).
READY, LEASED, DONE = 0, 1, 2

items = Table(
    "items",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),  # arrival order
    Column("state", Integer, nullable=False, default=READY),
    Column("model_version", Integer, nullable=False),
    Column("priority", Float, nullable=False, default=0.0),
    Column("use_count", Integer, nullable=False, default=0),
    Column("ready_at", Float, nullable=False, default=0.0),  # unix s; cooldown end
    Column("created_at", Float, nullable=False),  # unix s
    Column("lease_id", String, nullable=True),
    Column("lease_expires", Float, nullable=True),  # unix s
    # unix s of the claim that leased the row: a priority item's reuse cooldown runs from its read,
    # as in Trinity, even when the reader acks much later.
    Column("leased_at", Float, nullable=True),
    # reader_id of the Read that took the lease (NULL: none given): a restarted reader gives back
    # the leases its killed predecessor took but never learnt the id of (Nack by reader_id).
    Column("leased_by", String, nullable=True),
    sqlite_autoincrement=True,
)
# The serialized trinity_grpc.common.v1.Experience of each item (id = items.id); deleted with
# its item by the trigger below.
payloads = Table(
    "payloads",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("payload", LargeBinary, nullable=False),
)
PAYLOADS_TRIGGER = (
    "CREATE TRIGGER IF NOT EXISTS items_payload_delete AFTER DELETE ON items "
    "BEGIN DELETE FROM payloads WHERE id = old.id; END"
)
# Partial indexes on ready rows: claims scan only what they can take (doubles claim rate here).
Index("ix_items_ready_fifo", items.c.id, sqlite_where=text("state = 0"))
Index("ix_items_lease", items.c.lease_id, sqlite_where=text("lease_id IS NOT NULL"))
# When a row (re-)entered the queue: its write, or the end of its reuse cooldown. Priority ties are
# served in this order, so a reused item waits behind the items already at its priority (Trinity
# appends it to the back of its priority group).
ENTERED_AT = "max(created_at, ready_at)"
# Only priority buffers order by priority; fifo and table files skip maintaining this index.
PRIORITY_INDEX = (
    "CREATE INDEX IF NOT EXISTS ix_items_ready_priority_entered "
    f"ON items (priority DESC, {ENTERED_AT}, id) WHERE state = 0"
)
# The index of files from before ENTERED_AT ordered ties.
OLD_PRIORITY_INDEX = "DROP INDEX IF EXISTS ix_items_ready_priority"

# Single row (id = 1) of lifetime counters, updated in the transaction that changes them.
counters = Table(
    "counters",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("written", Integer, nullable=False, default=0),
    Column("read", Integer, nullable=False, default=0),
    Column("acked", Integer, nullable=False, default=0),
    Column("dropped", Integer, nullable=False, default=0),
)

# Idempotency keys of writes, what the first write did, and a digest of its content
# (kinds/write_keys.py; NULL in keys of files from before the digest).
write_keys = Table(
    "write_keys",
    metadata,
    Column("key", String, primary_key=True),
    Column("written", Integer, nullable=False),
    Column("evicted", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("content_hash", LargeBinary, nullable=True),
)

writers = Table(
    "writers",
    metadata,
    Column("writer_id", String, primary_key=True),
    Column("closed", Integer, nullable=False, default=0),
)

# The spec the buffer was created with (key "spec", JSON), so run-time buffers reopen on restart.
meta = Table(
    "meta",
    metadata,
    Column("key", String, primary_key=True),
    Column("value", String, nullable=False),
)

# Taskset read cursors, one per reader.
cursors = Table(
    "cursors",
    metadata,
    Column("reader_id", String, primary_key=True),
    Column("epoch", Integer, nullable=False),
    Column("offset", Integer, nullable=False),  # tasks taken in this epoch
    Column("batch_index", Integer, nullable=False),  # batches handed out since the start
    Column("tasks_read", Integer, nullable=False),
)

# Pass rates reported for tasks (difficulty_based selector).
feedback = Table(
    "feedback",
    metadata,
    Column("task_id", String, primary_key=True),
    Column("pass_rate", Float, nullable=False),
    Column("reports", Integer, nullable=False),
)

# BOTS estimator state of a taskset (difficulty_based with feature_keys; kinds/bots.py): one row
# (id = 1), rewritten with the feedback table by every feedback report. Two float64 arrays of one
# value per task row (little-endian bytes): every report moves every task's belief, so one blob
# write beats a row per task. `data_digest` ties the state to the rows and features it was
# computed from; a changed taskset file starts the estimator afresh.
bots_state = Table(
    "bots_state",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("data_digest", String, nullable=False),
    Column("alphas", LargeBinary, nullable=False),
    Column("betas", LargeBinary, nullable=False),
    Column("cap_coef", Float, nullable=True),  # NULL before the first report
    Column("rho_halvings", Integer, nullable=False),  # adaptive_rho: rho = kwargs.rho / 2**this
    Column("updates", Integer, nullable=False),
)
