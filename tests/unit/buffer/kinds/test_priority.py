"""Priority queue orderings: the ones Trinity-RFT's own tests pin, and the rules behind them.

Trinity's tests/buffer/queue_test.py (test_priority_queue_capacity, _buffer_reuse,
_reuse_count_control) fix, for linear_decay  priority = model_version - decay * use_count:
highest priority first; a read counts a use and the item re-enters after reuse_cooldown_time,
behind the items already waiting at its priority; at capacity the lowest priority goes. Its
reuse tests hold 4 writes of 2 experiences in a capacity-4 queue (capacity counts writes there);
here capacity counts experiences, so the same queue is capacity 8 (see kinds/priority.py).
Every expected sequence below is derived by hand in the comment above it.
"""

from __future__ import annotations

import asyncio

import pytest

from services.buffer.core import BufferCore
from services.buffer.kinds.priority import DecayLimitRandomization, LinearDecay, make_priority_fn
from services.buffer.types import BufferSpec
from services.common.errors import InvalidArgument
from tests.unit.buffer.test_core import exp, labels

COOLDOWN = 0.2  # Trinity's tests use 0.5 s and sleep 1 s; only "cooled before the next read" matters
COOLED = COOLDOWN + 0.1


def spec(name: str, **options: object) -> BufferSpec:
    return BufferSpec(name, "priority", options)


@pytest.fixture
async def core(tmp_path):
    c = BufferCore(str(tmp_path / "d"))
    linear = {"priority_fn": "linear_decay", "priority_fn_args": {"decay": 0.6}}
    limited = {
        "priority_fn": "decay_limit_randomization",
        "priority_fn_args": {"decay": 1.2, "use_count_limit": 2, "sigma": 0.0},
    }
    await c.start(
        [
            spec("capacity", capacity=8, max_read_timeout=0.2, **linear),
            spec("reuse", capacity=8, reuse_cooldown_time=COOLDOWN, **linear),
            spec("limit", capacity=8, reuse_cooldown_time=COOLDOWN, **limited),
            spec("ties", capacity=8, reuse_cooldown_time=COOLDOWN, priority_fn_args={"decay": 1.0}),
            spec("room", capacity=2, reuse_cooldown_time=COOLDOWN, priority_fn_args={"decay": 1.0}),
            spec("late_ack", reuse_cooldown_time=COOLDOWN, priority_fn_args={"decay": 1.0}),
        ]
    )
    yield c
    await c.close()


async def write_pairs(core: BufferCore, name: str, versions: range) -> None:
    """One write of two experiences per version, as Trinity's reuse tests do."""
    for v in versions:
        await core.write(name, [exp(version=v, label=f"v{v}"), exp(version=v, label=f"v{v}")])


async def read_used(core: BufferCore, name: str, n: int) -> list[str]:
    """Read n, ack them (the trainer's step) and give their labels."""
    batch = await core.read(name, n, max_wait=0)
    await core.ack(batch.lease_id)
    return labels(batch.payloads)


def test_priority_fns_match_trinity_definitions():
    assert LinearDecay(decay=2.0)(5, 1) == (3.0, True)
    limited = DecayLimitRandomization(decay=1.0, use_count_limit=2, sigma=0.0)
    assert limited(5, 1) == (4.0, True) and limited(5, 2) == (3.0, False)
    with pytest.raises(InvalidArgument) as err:
        make_priority_fn("nope", {})
    assert err.value.field == "priority_fn"


async def test_trinity_capacity_8_keeps_the_newest_8(core):
    # Trinity's test_priority_queue_capacity: capacity 8, decay 0.6, no reuse, 12 writes of one
    # experience with model_version 0..11 (use_count 0, so priority = version).
    # v0..v7 fill the queue; v8 evicts the lowest (v0), v9 evicts v1, ... v11 evicts v3.
    for v in range(12):
        await core.write("capacity", [exp(version=v, label=f"v{v}")])
    stats = await core.stats("capacity")
    assert (stats.depth, stats.dropped) == (8, 4)
    # A read of 8 serves them highest first: v11 down to v4.
    first = await core.read("capacity", 8, max_wait=0)
    assert labels(first.payloads) == [f"v{v}" for v in range(11, 3, -1)]
    # Nothing is left: a read of 1 times out empty (Trinity raises TimeoutError), not end of data.
    late = await core.read("capacity", 1)
    assert (late.payloads, late.end_of_data) == ([], False)
    # Trinity's second round of 12 writes, while the 8 read items are still leased: read items
    # are out of the queue, so the same eviction happens again (v0..v3 dropped, v4..v11 kept).
    for v in range(12):
        await core.write("capacity", [exp(version=v, label=f"v{v}")], writer_id="explorer")
    await core.ack(first.lease_id)  # no cooldown: used once
    await core.close_writer("capacity", "explorer")  # Trinity: writer.release()
    second = await core.read("capacity", 8, max_wait=0)
    assert labels(second.payloads) == [f"v{v}" for v in range(11, 3, -1)]
    await core.ack(second.lease_id)
    assert (await core.read("capacity", 1)).end_of_data  # Trinity: StopIteration


async def test_trinity_reuse_orderings(core):
    # Trinity's test_priority_queue_buffer_reuse: linear_decay 0.6, 4 writes of 2 (v0..v3) fill
    # the queue; the write of v4 evicts the lowest, v0. Queue: v4 4.0, v3 3.0, v2 2.0, v1 1.0.
    await write_pairs(core, "reuse", range(5))
    assert (await core.stats("reuse")).dropped == 2
    steps = [
        # read v4, v3 -> use 1 -> re-enter at 4-0.6=3.4, 3-0.6=2.4
        ["v4", "v4", "v3", "v3"],
        # queue v4 3.4, v3 2.4, v2 2.0, v1 1.0 -> read v4, v3 -> use 2 -> 2.8, 1.8
        ["v4", "v4", "v3", "v3"],
        # queue v4 2.8, v2 2.0, v3 1.8, v1 1.0 -> read v4, v2 -> v4 use 3 -> 2.2, v2 use 1 -> 1.4
        ["v4", "v4", "v2", "v2"],
        # queue v4 2.2, v3 1.8, v2 1.4, v1 1.0 -> read v4, v3 -> v4 use 4 -> 1.6, v3 use 3 -> 1.2
        ["v4", "v4", "v3", "v3"],
        # queue v4 1.6, v2 1.4, v3 1.2, v1 1.0 -> read v4, v2 -> v4 use 5 -> 4-3.0=1.0, v2 use 2 -> 0.8
        ["v4", "v4", "v2", "v2"],
        # queue v3 1.2, v1 1.0, v4 1.0, v2 0.8: v1 and v4 tie at 1.0 and v4 re-entered last,
        # so it waits behind v1 -> read v3, v1
        ["v3", "v3", "v1", "v1"],
    ]
    for expected in steps:
        assert await read_used(core, "reuse", 4) == expected
        await asyncio.sleep(COOLED)


async def test_trinity_reuse_count_limit(core):
    # Trinity's test_priority_queue_reuse_count_control: decay_limit_randomization with decay 1.2,
    # use_count_limit 2, sigma 0; an item goes back only while use_count < 2.
    # Writes v0..v4 as pairs: v0 evicted; queue v4 4.0, v3 3.0, v2 2.0, v1 1.0.
    await write_pairs(core, "limit", range(5))
    # read v4, v3 (use 1 < 2: back at 4-1.2=2.8, 3-1.2=1.8); all four pairs queued after the cooldown
    assert await read_used(core, "limit", 4) == ["v4", "v4", "v3", "v3"]
    await asyncio.sleep(COOLED)
    assert (await core.stats("limit")).depth == 8
    # queue v4 2.8, v2 2.0, v3 1.8, v1 1.0 -> read v4 (use 2: used up), v2 (use 1: back at 0.8)
    assert await read_used(core, "limit", 4) == ["v4", "v4", "v2", "v2"]
    await asyncio.sleep(COOLED)
    assert (await core.stats("limit")).depth == 6  # Trinity: length 3 writes
    # queue v3 1.8, v1 1.0, v2 0.8 -> read v3 (use 2: used up), v1 (use 1: back at 1-1.2=-0.2)
    assert await read_used(core, "limit", 4) == ["v3", "v3", "v1", "v1"]
    await asyncio.sleep(COOLED)
    assert (await core.stats("limit")).depth == 4  # Trinity: length 2 (v2 0.8, v1 -0.2)


async def test_reused_items_wait_behind_their_priority(core):
    # decay 1: a (v5) and d (v5) tie at 5 and come out in arrival order; after one read each
    # they re-enter at 4, behind b and c (v4) that were already waiting there: b, c, a, d.
    await core.write("ties", [exp(version=v, label=x) for v, x in ((5, "a"), (4, "b"), (4, "c"), (5, "d"))])
    assert await read_used(core, "ties", 2) == ["a", "d"]
    await asyncio.sleep(COOLED)
    assert await read_used(core, "ties", 4) == ["b", "c", "a", "d"]


async def test_cooling_items_are_out_of_the_queue_until_they_re_enter(core):
    # capacity 2, decay 1. a (v5) is read and cools down (re-enters at 4). Meanwhile b (v3) and
    # c (v2) fill the queue without evicting anything. When a re-enters, the queue holds 3 > 2:
    # the lowest, c, goes, as in Trinity when a cooled item is put into a full queue.
    await core.write("room", [exp(version=5, label="a")])
    assert await read_used(core, "room", 1) == ["a"]
    result = await core.write("room", [exp(version=3, label="b"), exp(version=2, label="c")])
    assert result.evicted == 0
    await asyncio.sleep(COOLED)
    assert await read_used(core, "room", 3) == ["a", "b"]
    assert (await core.stats("room")).dropped == 1


async def test_cooldown_runs_from_the_read_not_the_ack(core):
    # The trainer acks after its step; if that took longer than the cooldown, the item is
    # readable again at once (Trinity re-inserts it reuse_cooldown_time after the read).
    await core.write("late_ack", [exp(version=3, label="x")])
    batch = await core.read("late_ack", 1, max_wait=0)
    await asyncio.sleep(COOLED)
    await core.ack(batch.lease_id)
    assert labels((await core.read("late_ack", 1, max_wait=0)).payloads) == ["x"]


async def test_nack_returns_items_unused_at_their_place(core):
    # Our lease rule (Trinity has none): a nacked item keeps its use_count and its place.
    await core.write("ties", [exp(version=4, label=x) for x in "abc"])
    batch = await core.read("ties", 1, max_wait=0)
    assert await core.nack(batch.lease_id) == 1
    assert await read_used(core, "ties", 3) == ["a", "b", "c"]


async def test_without_cooldown_items_are_used_once(tmp_path):
    c = BufferCore(str(tmp_path / "d"))
    await c.start([spec("once", capacity=8)])
    await c.write("once", [exp(version=v, label=f"v{v}") for v in (1, 2)])
    assert await read_used(c, "once", 2) == ["v2", "v1"]
    assert (await c.read("once", 2, max_wait=0.1)).payloads == []
    await c.close()
