"""Crash and restart of a real buffer process: acknowledged writes and taskset cursors survive."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

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


async def test_extensions_of_a_batch_are_read_again_after_a_kill(tmp_path):
    """ReadTasks(extend=true) over the wire: the step's batch and its extensions share the batch
    index; an explorer killed mid-step and its SIGKILLed buffer come back to the same tasks."""
    from services.common.errors import FailedPrecondition

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(10)))
    port = free_port()
    config = buffer_config(tmp_path, port, taskset=str(tasks))

    def prompts(batch) -> list[str]:
        return [t.raw_task["prompt"] for t in batch.tasks]

    proc = await astart_buffer(tmp_path, config, port)
    try:
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=10) as client:
            with pytest.raises(FailedPrecondition):
                await client.read_tasks("tasks", 2, reader_id="explorer", extend=True)
            batch = await client.read_tasks("tasks", 2, reader_id="explorer")
            more = await client.read_tasks("tasks", 2, reader_id="explorer", extend=True)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert (prompts(batch), prompts(more), batch.batch_index, more.batch_index) == (
        ["p0", "p1"],
        ["p2", "p3"],
        0,
        0,
    )
    proc = await astart_buffer(tmp_path, config, port)
    try:
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=10) as client:
            again = await client.read_tasks("tasks", 2, reader_id="explorer", repeat_last=True)
            again_more = await client.read_tasks("tasks", 2, reader_id="explorer", extend=True)
            after = await client.read_tasks("tasks", 2, reader_id="explorer")
    finally:
        assert stop_process(proc, timeout=10) == 0
    assert (prompts(again), prompts(again_more)) == (["p0", "p1"], ["p2", "p3"])
    assert (prompts(after), after.batch_index) == (["p4", "p5"], 1)


async def test_a_reused_idempotency_key_is_checked_against_its_content_across_a_restart(tmp_path):
    """Same key, same experiences: "duplicate", also after a SIGKILL and restart (the buffer that
    compares is not the one that stored the digest). Same key, other experiences: ALREADY_EXISTS
    naming the key, nothing stored: reusing a key no longer loses data without a word."""
    port = free_port()
    config = buffer_config(tmp_path, port)
    first = [exp(label="a"), exp(label="b")]
    for e in first:
        e.metrics.update({f"m{i}": float(i) for i in range(12)})  # map order is the writer's
    proc = await astart_buffer(tmp_path, config, port)
    try:
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=10) as client:
            await client.create_buffer("keyed", "fifo")
            assert (await client.write("keyed", first, idempotency_key="k1")).written == 2
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    proc = await astart_buffer(tmp_path, config, port)
    try:
        async with await BufferClient.connect(f"127.0.0.1:{port}", timeout=10) as client:
            for e in first:  # the same metrics, inserted in the reverse order
                e.metrics = {f"m{i}": float(i) for i in reversed(range(12))}
            retry = await client.write("keyed", first, idempotency_key="k1")
            with pytest.raises(errors.AlreadyExists) as err:
                await client.write("keyed", [exp(label="a"), exp(label="c")], idempotency_key="k1")
            stats = await client.stats("keyed")
    finally:
        assert stop_process(proc, timeout=10) == 0
    assert (retry.written, retry.duplicate) == (0, True)
    assert err.value.field == "idempotency_key"
    assert "idempotency key 'k1'" in err.value.message and "content differs" in err.value.message
    assert (stats.written, stats.depth) == (2, 2)
