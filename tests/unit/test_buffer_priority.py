"""Priority queue orderings for a capacity-8 queue, derived from Trinity's linear_decay.

The reference docs in /work/shared/reference do not list the orderings, so they are derived
here from the definition  priority = model_version - decay * use_count  (highest first, ties by
arrival), where use_count counts the reads of an item, and from reuse_cooldown_time: an acked
item is readable again only after the cooldown, with its new priority.
"""

from __future__ import annotations

import asyncio

import pytest

from services.buffer.core import BufferCore
from services.buffer.kinds.priority import DecayLimitRandomization, LinearDecay, make_priority_fn
from services.buffer.types import BufferSpec
from services.common.errors import InvalidArgument
from tests.unit.test_buffer_core import exp, labels

COOLDOWN = 0.3


@pytest.fixture
async def core(tmp_path):
    c = BufferCore(str(tmp_path / "d"))
    await c.start(
        [
            BufferSpec(
                "p",
                "priority",
                {
                    "capacity": 8,
                    "reuse_cooldown_time": COOLDOWN,
                    "priority_fn": "linear_decay",
                    "priority_fn_args": {"decay": 2.0},
                },
            ),
            BufferSpec(
                "ties",
                "priority",
                {"capacity": 8, "reuse_cooldown_time": COOLDOWN, "priority_fn_args": {"decay": 1.0}},
            ),
            BufferSpec("once", "priority", {"capacity": 8}),
        ]
    )
    yield c
    await c.close()


def test_priority_fns_match_trinity_definitions():
    assert LinearDecay(decay=2.0)(5, 1) == (3.0, True)
    limited = DecayLimitRandomization(decay=1.0, use_count_limit=2, sigma=0.0)
    assert limited(5, 1) == (4.0, True) and limited(5, 2) == (3.0, False)
    with pytest.raises(InvalidArgument) as err:
        make_priority_fn("nope", {})
    assert err.value.field == "priority_fn"


async def test_capacity_8_eviction_order_and_cooldown(core):
    # Versions 0..9 into capacity 8: the two lowest priorities (v0, v1; use_count 0) are evicted.
    result = await core.write("p", [exp(version=v, label=f"v{v}") for v in range(10)])
    assert result.evicted == 2
    first = await core.read("p", 4, max_wait=0)
    assert labels(first.payloads) == ["v9", "v8", "v7", "v6"]  # priority = version
    await core.ack(first.lease_id)
    # v9..v6 now have use_count 1 -> priorities 7, 6, 5, 4, but they cool down first:
    second = await core.read("p", 4, max_wait=0)
    assert labels(second.payloads) == ["v5", "v4", "v3", "v2"]
    await core.ack(second.lease_id)  # -> priorities 3, 2, 1, 0
    await asyncio.sleep(COOLDOWN + 0.05)
    # After the cooldown all eight are back:  v9:7 v8:6 v7:5 v6:4 v5:3 v4:2 v3:1 v2:0
    third = await core.read("p", 8, max_wait=0)
    assert labels(third.payloads) == ["v9", "v8", "v7", "v6", "v5", "v4", "v3", "v2"]


async def test_ties_are_served_in_arrival_order(core):
    # decay 1: a (v5) and d (v5) tie at 5 and come out in arrival order; after one read each,
    # both drop to 4 and tie with b and c (v4, never read): arrival order a, b, c, d.
    await core.write("ties", [exp(version=v, label=x) for v, x in ((5, "a"), (4, "b"), (4, "c"), (5, "d"))])
    first = await core.read("ties", 2, max_wait=0)
    assert labels(first.payloads) == ["a", "d"]
    await core.ack(first.lease_id)
    await asyncio.sleep(COOLDOWN + 0.05)
    second = await core.read("ties", 4, max_wait=0)
    assert labels(second.payloads) == ["a", "b", "c", "d"]


async def test_without_cooldown_items_are_used_once(core):
    await core.write("once", [exp(version=v, label=f"v{v}") for v in (1, 2)])
    batch = await core.read("once", 2, max_wait=0)
    assert labels(batch.payloads) == ["v2", "v1"]
    await core.ack(batch.lease_id)
    assert (await core.read("once", 2, max_wait=0.1)).payloads == []


async def test_decay_limit_randomization_stops_reuse_at_the_limit(tmp_path):
    c = BufferCore(str(tmp_path / "d"))
    opts = {
        "reuse_cooldown_time": 0.0,
        "priority_fn": "decay_limit_randomization",
        "priority_fn_args": {"decay": 1.0, "use_count_limit": 2, "sigma": 0.0},
    }
    await c.start([BufferSpec("p", "priority", opts)])
    await c.write("p", [exp(version=3, label="x")])
    reads = 0
    while (batch := await c.read("p", 1, max_wait=0)).payloads:
        reads += 1
        await c.ack(batch.lease_id)
    assert reads == 2  # put back after the 1st use (1 < 2), dropped after the 2nd
    await c.close()
