"""Crash and restart of a real buffer process: acknowledged writes and taskset cursors survive."""

from __future__ import annotations

import asyncio
import json
import os
import signal

from services.buffer.client import BufferClient
from services.common import errors
from services.common.procs import free_port, stop_process
from tests.integration.test_buffer_server import astart_buffer, buffer_config, exp, labels


async def test_every_acknowledged_write_survives_sigkill(tmp_path):
    port = free_port()
    config = buffer_config(tmp_path, port)
    proc = await astart_buffer(tmp_path, config, port)
    acknowledged: list[str] = []
    try:
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=5, max_retries=0) as client:
            await client.create_buffer("durable", "fifo")

            async def writer() -> None:
                for i in range(10_000):
                    batch = [exp(version=i % 3, label=f"{i}-{j}") for j in range(16)]
                    try:
                        await client.write("durable", batch, idempotency_key=f"b{i}")
                    except errors.TrinityError:
                        return  # the server died under this write: it was never acknowledged
                    acknowledged.extend(f"{i}-{j}" for j in range(16))

            task = asyncio.create_task(writer())
            while len(acknowledged) < 40 * 16:
                await asyncio.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)  # in the middle of the stream of writes
            await asyncio.wait_for(task, 30)
            assert proc.wait(10) == -signal.SIGKILL
    finally:
        stop_process(proc, timeout=5)
    proc = await astart_buffer(tmp_path, config, port)
    try:
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=10) as client:
            stored: list[str] = []
            while (batch := await client.read("durable", 512, max_wait=0)).experiences:
                stored += labels(batch)
                await client.ack(batch.lease_id)
            stats = await client.stats("durable")
    finally:
        assert stop_process(proc, timeout=10) == 0
    assert set(acknowledged) <= set(stored)
    assert len(stored) == len(set(stored)) == stats.written  # nothing twice, counters agree with the rows
    assert stored == sorted(stored, key=lambda s: tuple(map(int, s.split("-"))))  # FIFO order kept


async def test_taskset_cursor_survives_a_restart(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(10)))
    port = free_port()
    config = buffer_config(tmp_path, port, taskset=str(tasks))
    proc = await astart_buffer(tmp_path, config, port)
    try:
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=10) as client:
            before = [await client.read_tasks("tasks", 2, reader_id="explorer") for _ in range(2)]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    proc = await astart_buffer(tmp_path, config, port)
    try:
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=10) as client:
            after = await client.read_tasks("tasks", 2, reader_id="explorer")
            other = await client.read_tasks("tasks", 2, reader_id="another-explorer")
    finally:
        assert stop_process(proc, timeout=10) == 0
    assert [[t.raw_task["prompt"] for t in b.tasks] for b in before] == [["p0", "p1"], ["p2", "p3"]]
    assert [t.raw_task["prompt"] for t in after.tasks] == ["p4", "p5"] and after.batch_index == 2
    assert [t.raw_task["prompt"] for t in other.tasks] == ["p0", "p1"]  # each reader has its own cursor
