"""The buffer service without gRPC: named buffers, each in its own SQLite file.

Layout: `<data_dir>/<name>.sqlite` per buffer (a queue or sql buffer whose config sets `path`
uses that file instead). One file per buffer keeps buffers independent: each has its own writer
task, so a busy experience queue never queues behind a taskset cursor update, and deleting a
buffer is deleting a file. Each file records the spec it was created with, so buffers created at
run time (CreateBuffer) are reopened after a restart.

Buffers named in the config are created at start (see `specs_from_config`). The servicer
(server.py) only converts messages and calls these methods; errors are services.common.errors.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from services.buffer.kinds.fifo import FifoBuffer
from services.buffer.kinds.item_state import LEASE_SEP, ItemStats
from services.buffer.kinds.items import ItemBuffer
from services.buffer.kinds.mix import TasksetMix
from services.buffer.kinds.priority import PriorityBuffer, make_priority_fn
from services.buffer.kinds.table import TableBuffer
from services.buffer.kinds.taskset import TasksetBuffer, TasksetSettings
from services.buffer.storage import schema as s
from services.buffer.storage.engine import Database
from services.buffer.taskfile import load_rows
from services.buffer.types import BufferSpec, MixSpec, ReadResult, Stats, TaskBatch, WriteResult
from services.buffer.validate import to_items
from services.common.config.buffer import StorageConfig
from services.common.config.tasksets import TasksetDefaults, effective_taskset, task_settings
from services.common.errors import AlreadyExists, InvalidArgument, NotFound
from trinity_grpc.common.v1 import common_pb2 as pb

KINDS = ("taskset", "fifo", "priority", "table")
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
Buffer = ItemBuffer | TasksetBuffer


@dataclass
class Defaults:
    """What the config gives every buffer: lease and batch limits, and what tasksets fall back to."""

    lease_s: float = 600.0
    max_batch_items: int = 4096
    tasksets: TasksetDefaults = field(default_factory=TasksetDefaults)


def storage_of(spec: BufferSpec) -> StorageConfig:
    """Validate a spec's options as a StorageConfig; errors name `spec.options.<key>`."""
    options = {k: v for k, v in spec.options.items() if k != "is_eval"}
    try:
        return StorageConfig.model_validate({**options, "name": spec.name})
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise InvalidArgument(
            f"{first['msg']} (allowed keys: {sorted(StorageConfig.model_fields)})",
            field=f"spec.options.{key}",
        ) from None


class BufferCore:
    def __init__(self, data_dir: str, defaults: Defaults | None = None) -> None:
        self.data_dir = data_dir
        self.defaults = defaults or Defaults()
        self.buffers: dict[str, Buffer] = {}
        self.specs: dict[str, BufferSpec] = {}
        self.mixes: dict[str, TasksetMix] = {}  # several training tasksets read as one (not buffers)
        self._dbs: dict[str, Database] = {}
        self._create_lock = asyncio.Lock()
        self.started_at = time.time()

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self, specs: Sequence[BufferSpec] = (), mixes: Sequence[MixSpec] = ()) -> None:
        """Create the configured buffers and mixes, then reopen buffers created at run time earlier."""
        for spec in specs:
            await self.create(spec, replace=True)
        for mix in mixes:
            await self.create_mix(mix)
        for path in _sqlite_files(self.data_dir):
            if os.path.basename(path)[: -len(".sqlite")] not in {*self.buffers, *self.mixes}:
                stored = await _stored_spec(path)
                if stored is not None and stored.name not in self.buffers:
                    await self.create(stored)

    async def close(self) -> None:
        for db in self._dbs.values():
            await db.close()

    # ---- buffers -------------------------------------------------------------------------
    async def create(self, spec: BufferSpec, *, replace: bool = False) -> bool:
        """Create a buffer; False when an identical one exists. `replace`: config wins over the stored spec."""
        if not NAME_RE.match(spec.name):
            raise InvalidArgument(
                f"buffer name {spec.name!r} must match [A-Za-z0-9_.-]{{1,128}}", field="spec.name"
            )
        if spec.kind not in KINDS:
            raise InvalidArgument(f"unknown kind {spec.kind!r}; one of {list(KINDS)}", field="spec.kind")
        async with self._create_lock:
            existing = self.specs.get(spec.name)
            if existing is not None:
                if existing.to_json() == spec.to_json():
                    return False
                raise AlreadyExists(f"buffer {spec.name!r} exists as {existing.to_json()}", field="spec.name")
            storage = storage_of(spec)
            db = Database(self._db_path(spec, storage))
            await db.open(s.metadata)
            try:
                buf = await self._build(spec, storage, db)
                await db.write(lambda conn: _store_spec(conn, spec))
            except BaseException:
                await db.close()
                raise
            self.buffers[spec.name], self.specs[spec.name], self._dbs[spec.name] = buf, spec, db
            return True

    async def create_mix(self, spec: MixSpec) -> None:
        """Read the tasksets `spec.members` (created already) as one under `spec.name`; its cursors
        live in <data_dir>/<name>.sqlite."""
        if spec.name in self.buffers or spec.name in self.mixes or not NAME_RE.match(spec.name):
            raise InvalidArgument(f"mix name {spec.name!r} is taken or invalid", field="tasksets")
        members = [self.taskset(name) for name in spec.members]
        db = Database(os.path.join(self.data_dir, f"{spec.name}.sqlite"))
        await db.open(s.metadata)
        try:
            mix = TasksetMix(
                spec.name, db, members, total_epochs=spec.total_epochs, total_steps=spec.total_steps
            )
            await mix.load()
        except BaseException:
            await db.close()
            raise
        self.mixes[spec.name], self._dbs[f"{spec.name}#mix"] = mix, db

    def _db_path(self, spec: BufferSpec, storage: StorageConfig) -> str:
        if spec.kind != "taskset" and storage.path:
            return storage.path.removeprefix("sqlite:///")
        return os.path.join(self.data_dir, f"{spec.name}.sqlite")

    async def _build(self, spec: BufferSpec, st: StorageConfig, db: Database) -> Buffer:
        d = self.defaults
        if spec.kind == "taskset":
            if not st.path:
                raise InvalidArgument(
                    "a taskset needs `path` (jsonl/parquet file or dataset directory)",
                    field="spec.options.path",
                )
            rows = await asyncio.to_thread(load_rows, st.path, split=st.split, subset_name=st.subset_name)
            is_eval = bool(spec.options.get("is_eval", False))
            st = effective_taskset(st, d.tasksets, is_eval=is_eval)
            sel = st.selector
            settings = TasksetSettings(
                **task_settings(st),
                is_eval=is_eval,
                total_epochs=st.total_epochs or 1,
                total_steps=st.total_steps,
                selector=sel.selector_type,
                seed=sel.seed,
                target_pass_rate=sel.target_pass_rate,
                temperature=sel.temperature,
                feature_keys=list(sel.feature_keys),
                bots=sel.kwargs,
            )
            taskset = TasksetBuffer(spec.name, db, rows, settings)
            await taskset.load()
            return taskset
        buf: ItemBuffer
        if spec.kind in ("fifo", "table"):
            kind = FifoBuffer if spec.kind == "fifo" else TableBuffer
            buf = kind(
                spec.name, db, capacity=st.capacity, max_read_timeout=st.max_read_timeout, lease_s=d.lease_s
            )
        else:
            fn = make_priority_fn(st.replay.priority_fn, st.replay.priority_fn_args)
            buf = PriorityBuffer(
                spec.name,
                db,
                priority_fn=fn,
                reuse_cooldown_time=st.replay.reuse_cooldown_time,
                capacity=st.capacity,
                max_read_timeout=st.max_read_timeout,
                lease_s=d.lease_s,
            )
        await buf.ensure_counters()
        await buf.load()
        return buf

    def get(self, name: str) -> Buffer:
        buf = self.buffers.get(name)
        if buf is None:
            raise NotFound(
                f"no buffer named {name!r}; existing buffers: {sorted(self.buffers)}", field="buffer"
            )
        return buf

    def _names(self, kind: type[ItemBuffer] | type[TasksetBuffer]) -> builtins.list[str]:
        return sorted(n for n, b in self.buffers.items() if isinstance(b, kind))

    def items(self, name: str, field: str = "buffer") -> ItemBuffer:
        """The experience buffer (fifo, priority or table) `name`; a NotFound names only those."""
        buf = self.buffers.get(name)
        if buf is None:
            raise NotFound(
                f"no experience buffer named {name!r}; existing experience buffers: {self._names(ItemBuffer)}",
                field=field,
            )
        if not isinstance(buf, ItemBuffer):
            raise InvalidArgument(f"buffer {name!r} is a taskset; use ReadTasks", field=field)
        return buf

    def taskset(self, name: str) -> TasksetBuffer:
        """The taskset `name`; a NotFound names only tasksets (not the fifos beside them)."""
        buf = self.buffers.get(name)
        if buf is None:
            raise NotFound(
                f"no taskset named {name!r}; existing tasksets: {self._names(TasksetBuffer)}", field="taskset"
            )
        if not isinstance(buf, TasksetBuffer):
            raise InvalidArgument(f"buffer {name!r} is a {buf.kind}, not a taskset", field="taskset")
        return buf

    def list(self) -> list[BufferSpec]:
        return list(self.specs.values())

    # ---- experiences ---------------------------------------------------------------------
    async def write(
        self,
        name: str,
        experiences: Sequence[pb.Experience],
        *,
        key: str = "",
        writer_id: str = "",
        timeout: float | None = None,
    ) -> WriteResult:
        """Validate all, then store all in one transaction (after backpressure, if any)."""
        buf = self.items(name)
        items = to_items(experiences, max_items=self.defaults.max_batch_items)
        return await buf.write(
            items, key=key, writer_id=writer_id, timeout=buf.max_read_timeout if timeout is None else timeout
        )

    async def read(
        self,
        name: str,
        batch_size: int,
        *,
        max_wait: float = -1.0,
        lease_s: float = 0.0,
        min_model_version: int = 0,
        reader_id: str = "",
    ) -> ReadResult:
        buf = self.items(name)
        if not 1 <= batch_size <= self.defaults.max_batch_items:
            raise InvalidArgument(
                f"batch_size must be in [1, {self.defaults.max_batch_items}], got {batch_size}",
                field="batch_size",
            )
        if lease_s < 0:
            raise InvalidArgument(f"lease_s must be >= 0, got {lease_s}", field="lease_s")
        return await buf.read(
            batch_size,
            max_wait=max_wait,
            lease_s=lease_s,
            min_model_version=min_model_version,
            reader_id=reader_id,
        )

    def _lease_owner(self, lease_id: str) -> ItemBuffer:
        name, sep, _ = lease_id.partition(LEASE_SEP)
        if not sep or name not in self.buffers:
            raise NotFound(f"lease {lease_id!r} belongs to no buffer", field="lease_id")
        return self.items(name, field="lease_id")

    async def ack(self, lease_id: str) -> int:
        return await self._lease_owner(lease_id).ack(lease_id)

    async def nack(self, lease_id: str = "", *, reader_id: str = "", buffer: str = "") -> int:
        """Give back one lease, or (reader_id and buffer) every lease that reader holds in the buffer."""
        if lease_id and reader_id:
            raise InvalidArgument(
                "set lease_id (one lease) or reader_id (every lease of that reader), not both",
                field="reader_id",
            )
        if reader_id:
            if not buffer:
                raise InvalidArgument("a Nack by reader_id needs the buffer it read from", field="buffer")
            return await self.items(buffer).nack_reader(reader_id)
        if not lease_id:
            raise InvalidArgument(
                "set lease_id (one lease) or reader_id with buffer (every lease of that reader)",
                field="lease_id",
            )
        if buffer:
            raise InvalidArgument(
                "buffer goes with reader_id; a lease_id names its own buffer", field="buffer"
            )
        return await self._lease_owner(lease_id).nack(lease_id)

    async def scan(self, name: str, offset: int, limit: int) -> tuple[builtins.list[bytes], int]:
        if offset < 0:
            raise InvalidArgument(f"offset must be >= 0, got {offset}", field="offset")
        if not 1 <= limit <= self.defaults.max_batch_items:
            raise InvalidArgument(
                f"limit must be in [1, {self.defaults.max_batch_items}], got {limit}", field="limit"
            )
        return await self.items(name).scan(offset, limit)

    async def open_writer(self, name: str, writer_id: str) -> None:
        await self.items(name).set_writer(writer_id, closed=False)

    async def close_writer(self, name: str, writer_id: str) -> None:
        await self.items(name).set_writer(writer_id, closed=True)

    # ---- tasks ---------------------------------------------------------------------------
    async def read_tasks(
        self,
        name: str,
        batch_size: int,
        *,
        reader_id: str = "",
        rewind: bool = False,
        repeat_last: bool = False,
        extend: bool = False,
    ) -> TaskBatch:
        if batch_size < 1:
            raise InvalidArgument(f"batch_size must be >= 1, got {batch_size}", field="batch_size")
        source = self.mixes.get(name) or self.taskset(name)
        return await source.read_tasks(
            batch_size, reader_id=reader_id, rewind=rewind, repeat_last=repeat_last, extend=extend
        )

    async def report_feedback(self, name: str, feedback: builtins.list[tuple[str, float]]) -> None:
        await self.taskset(name).report_feedback(feedback)

    # ---- stats ---------------------------------------------------------------------------
    async def stats(self, name: str) -> Stats:
        buf = self.mixes.get(name) or self.get(name)
        if isinstance(buf, TasksetBuffer | TasksetMix):
            t = buf.stats()
            return Stats(
                name,
                "taskset",
                depth=t["depth"],
                written=t["written"],
                read=t["read"],
                end_of_data=t["end_of_data"],
            )
        st: ItemStats = await buf.stats()
        return Stats(name, buf.kind, **st.__dict__)

    def summary(self) -> dict[str, float]:
        """Numbers for GetInfo: depth of every experience buffer."""
        return {
            f"{n}.depth": float(b.available()) for n, b in self.buffers.items() if isinstance(b, ItemBuffer)
        }


def _sqlite_files(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        return []
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".sqlite")]


async def _store_spec(conn: Any, spec: BufferSpec) -> None:
    stmt = sqlite_insert(s.meta).values(key="spec", value=spec.to_json())
    await conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": spec.to_json()}))


async def _stored_spec(path: str) -> BufferSpec | None:
    db = Database(path)
    await db.open(s.metadata)
    try:
        row = await db.read(lambda conn: _first(conn, select(s.meta.c.value).where(s.meta.c.key == "spec")))
    finally:
        await db.close()
    if row is None:
        return None
    data = json.loads(row[0])
    return BufferSpec(data["name"], data["kind"], data.get("options", {}))


async def _first(conn: Any, stmt: Any) -> Any:
    return (await conn.execute(stmt)).first()
