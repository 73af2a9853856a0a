"""BufferCore without gRPC: experience buffers over real SQLite files in tmp_path."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from services.buffer.core import BufferCore, Defaults
from services.buffer.types import BufferSpec
from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from services.common.experience import Experience
from services.common.wire import experience_to_proto
from trinity_grpc.common.v1 import common_pb2 as pb


def exp(version: int = 0, label: str = "", n: int = 6, prompt: int = 2) -> pb.Experience:
    e = Experience(
        tokens=np.arange(n, dtype=np.int32),
        prompt_length=prompt,
        model_version=version,
        reward=1.0,
        logprobs=np.full(n - prompt, -0.5, np.float32),
        task_id=label,
    )
    return experience_to_proto(e)


def labels(payloads: list[bytes]) -> list[str]:
    return [pb.Experience.FromString(p).ids.task_id for p in payloads]


@pytest.fixture
async def core(tmp_path):
    c = BufferCore(str(tmp_path / "data"), Defaults(lease_s=30, max_batch_items=64))
    await c.start(
        [BufferSpec("q", "fifo", {"capacity": 4, "max_read_timeout": 5}), BufferSpec("t", "table", {})]
    )
    yield c
    await c.close()


async def test_fifo_order_and_ack_consumes(core):
    await core.write("q", [exp(label=x) for x in "abc"])
    batch = await core.read("q", 2, max_wait=0)
    assert labels(batch.payloads) == ["a", "b"]
    assert await core.ack(batch.lease_id) == 2
    rest = await core.read("q", 5, max_wait=0)
    assert labels(rest.payloads) == ["c"]
    st = await core.stats("q")
    assert (st.depth, st.leased, st.written, st.read, st.acked) == (0, 1, 3, 3, 2)


async def test_nack_returns_items_first_and_ack_after_nack_fails(core):
    await core.write("q", [exp(label=x) for x in "ab"])
    first = await core.read("q", 1, max_wait=0)
    assert await core.nack(first.lease_id) == 1
    again = await core.read("q", 2, max_wait=0)
    assert labels(again.payloads) == ["a", "b"]
    with pytest.raises(NotFound):
        await core.ack(first.lease_id)


async def test_nack_by_reader_returns_its_leases_in_order_and_survives_reopen(tmp_path):
    """A reader killed after the buffer committed its leases (ids never recorded) gets them back by
    reader id, in arrival order; leases of other readers and of anonymous reads stay."""
    data = str(tmp_path / "d")
    c1 = BufferCore(data, Defaults(lease_s=600))
    await c1.start([BufferSpec("q", "fifo", {}), BufferSpec("t", "table", {})])
    await c1.write("q", [exp(label=x) for x in "abcdef"])
    await c1.write("t", [exp(label="t0")])
    await c1.read("q", 2, max_wait=0, reader_id="trainer")  # a, b
    other = await c1.read("q", 1, max_wait=0, reader_id="other")  # c
    anonymous = await c1.read("q", 1, max_wait=0)  # d
    await c1.read("q", 1, max_wait=0, reader_id="trainer")  # e
    in_table = await c1.read("t", 1, max_wait=0, reader_id="trainer")
    await c1.close()

    c2 = BufferCore(data, Defaults(lease_s=600))
    await c2.start([BufferSpec("q", "fifo", {}), BufferSpec("t", "table", {})])
    assert (await c2.stats("q")).leased == 5
    assert await c2.nack(reader_id="trainer", buffer="q") == 3
    assert await c2.nack(reader_id="trainer", buffer="q") == 0  # nothing left to give back
    assert await c2.nack(reader_id="nobody", buffer="q") == 0
    st = await c2.stats("q")
    assert (st.depth, st.leased) == (4, 2)
    again = await c2.read("q", 10, max_wait=0, reader_id="trainer")
    assert labels(again.payloads) == ["a", "b", "e", "f"]
    assert await c2.ack(other.lease_id) == 1 and await c2.ack(anonymous.lease_id) == 1
    assert await c2.ack(in_table.lease_id) == 1  # only the named buffer was touched
    await c2.close()


async def test_a_cancelled_read_gives_back_the_rows_it_had_claimed(core):
    """A Read waiting to fill its batch whose caller hangs up: nobody will learn its lease.
    (With min_model_version a read claims what qualifies as it comes, then waits for more.)"""
    await core.write("q", [exp(version=1, label="a")])
    waiting = asyncio.create_task(core.read("q", 3, max_wait=30, min_model_version=1, reader_id="trainer"))
    for _ in range(200):
        if (await core.stats("q")).leased == 1:  # a is claimed; the read waits for 2 more
            break
        await asyncio.sleep(0.01)
    assert (await core.stats("q")).leased == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    st = await core.stats("q")
    assert (st.depth, st.leased) == (1, 0)
    assert labels((await core.read("q", 3, max_wait=0)).payloads) == ["a"]


async def test_nack_needs_exactly_one_of_lease_id_and_reader_id(core):
    with pytest.raises(InvalidArgument) as err:
        await core.nack()
    assert err.value.field == "lease_id"
    with pytest.raises(InvalidArgument) as err:
        await core.nack("q:x", reader_id="trainer", buffer="q")
    assert err.value.field == "reader_id"
    with pytest.raises(InvalidArgument) as err:
        await core.nack(reader_id="trainer")
    assert err.value.field == "buffer"
    with pytest.raises(InvalidArgument) as err:
        await core.nack("q:x", buffer="q")
    assert err.value.field == "buffer"
    with pytest.raises(NotFound) as err:
        await core.nack(reader_id="trainer", buffer="missing")
    assert err.value.field == "buffer"


async def test_expired_lease_makes_items_readable_again(core):
    await core.write("q", [exp(label="a")])
    leased = await core.read("q", 1, max_wait=0, lease_s=0.2)
    # the wait wakes when the lease expires, not at max_wait
    back = await core.read("q", 1, max_wait=5)
    assert labels(back.payloads) == ["a"] and back.lease_id != leased.lease_id
    with pytest.raises((FailedPrecondition, NotFound)):
        await core.ack(leased.lease_id)
    assert await core.ack(back.lease_id) == 1


async def test_idempotent_write_adds_nothing(core):
    first = await core.write("t", [exp(), exp()], key="k")
    again = await core.write("t", [exp(), exp()], key="k")
    assert (first.written, first.duplicate) == (2, False)
    assert (again.written, again.duplicate) == (0, True)
    assert (await core.stats("t")).written == 2


async def test_backpressure_waits_then_resource_exhausted(core):
    await core.write("q", [exp() for _ in range(4)])
    with pytest.raises(ResourceExhausted) as err:
        await core.write("q", [exp()], timeout=0.1)
    assert err.value.field == "experiences"
    waiting = asyncio.create_task(core.write("q", [exp(label="late")], timeout=10))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    batch = await core.read("q", 1, max_wait=0)
    await core.ack(batch.lease_id)
    assert (await waiting).written == 1
    with pytest.raises(InvalidArgument):  # can never fit
        await core.write("q", [exp() for _ in range(5)])


async def test_partial_batch_on_timeout(core):
    await core.write("q", [exp(label=x) for x in "ab"])
    batch = await core.read("q", 4, max_wait=0.2)
    assert labels(batch.payloads) == ["a", "b"] and not batch.end_of_data


async def test_end_of_data_after_all_writers_closed_and_drained(core):
    await core.open_writer("q", "w1")
    await core.write("q", [exp(label="a")], writer_id="w2")
    await core.close_writer("q", "w1")
    batch = await core.read("q", 4, max_wait=0)
    assert not batch.end_of_data
    await core.ack(batch.lease_id)
    assert not (await core.read("q", 4, max_wait=0)).end_of_data  # w2 still open
    await core.close_writer("q", "w2")
    final = await core.read("q", 4, max_wait=5)
    assert final.end_of_data and final.payloads == [] and final.lease_id == ""
    assert (await core.stats("q")).end_of_data


async def test_a_readers_short_last_batch_ends_its_data_though_it_holds_the_rows(core):
    # DAPO: a step that hit its refill cap wrote fewer rows than a batch, so the last batch is short
    await core.open_writer("q", "explorer")
    await core.write("q", [exp(label=x) for x in "abc"], writer_id="explorer")
    first = await core.read("q", 2, max_wait=0, lease_s=60, reader_id="trainer")
    assert labels(first.payloads) == ["a", "b"] and not first.end_of_data  # the writer is open
    await core.close_writer("q", "explorer")
    short = await core.read(
        "q", 4, max_wait=30, lease_s=60, reader_id="trainer"
    )  # returns at once, not in 30 s
    assert labels(short.payloads) == ["c"] and short.end_of_data
    again = await core.read("q", 1, max_wait=30, reader_id="trainer")  # its leases are all it waits on
    assert again.payloads == [] and again.end_of_data
    # another reader still waits: the trainer's rows come back to it if the trainer dies
    other = await core.read("q", 1, max_wait=0.2, reader_id="other")
    assert other.payloads == [] and not other.end_of_data
    await core.ack(first.lease_id)
    await core.ack(short.lease_id)
    assert (await core.read("q", 1, max_wait=0, reader_id="other")).end_of_data


async def test_rejected_write_changes_nothing_and_names_the_field(core):
    bad = exp(n=6, prompt=2)
    bad.logprobs.raw = np.zeros(3, np.float32).tobytes()  # 3 != response length 4
    with pytest.raises(InvalidArgument) as err:
        await core.write("t", [exp(), bad])
    assert err.value.field == "experiences[1].logprobs"
    nan = exp()
    nan.reward = math.nan
    with pytest.raises(InvalidArgument, match="finite") as err:
        await core.write("t", [nan])
    assert err.value.field == "experiences[0].reward"
    out_of_range = exp(n=4)
    out_of_range.prompt_length = 4
    with pytest.raises(InvalidArgument) as err:
        await core.write("t", [out_of_range])
    assert err.value.field == "experiences[0].prompt_length"
    wrong_dtype = exp()
    wrong_dtype.tokens.dtype = pb.ELEMENT_TYPE_FLOAT32
    with pytest.raises(InvalidArgument) as err:
        await core.write("t", [wrong_dtype])
    assert err.value.field == "experiences[0].tokens.dtype"
    with pytest.raises(InvalidArgument) as err:
        await core.write("t", [exp() for _ in range(65)])
    assert err.value.field == "experiences"
    with pytest.raises(NotFound) as err:
        await core.write("nope", [exp()])
    assert err.value.field == "buffer"
    st = await core.stats("t")
    assert (st.written, st.depth) == (0, 0)


async def test_table_is_rereadable_by_offset(core):
    await core.write("t", [exp(label=str(i)) for i in range(5)])
    batch = await core.read("t", 5, max_wait=0)
    await core.ack(batch.lease_id)
    rows, nxt = await core.scan("t", 0, 3)
    assert labels(rows) == ["0", "1", "2"] and nxt == 3
    rows, nxt = await core.scan("t", nxt, 10)
    assert labels(rows) == ["3", "4"] and nxt == 5
    assert (await core.read("t", 5, max_wait=0)).payloads == []  # read rows are marked read, not re-served


async def test_min_model_version_drops_stale(core):
    await core.write("t", [exp(version=v, label=str(v)) for v in (1, 3, 2, 5)])
    batch = await core.read("t", 4, max_wait=0.2, min_model_version=3)
    assert labels(batch.payloads) == ["3", "5"]
    assert (await core.stats("t")).dropped == 2


async def test_state_survives_reopen_and_runtime_buffers_come_back(tmp_path):
    data = str(tmp_path / "d")
    c1 = BufferCore(data)
    await c1.start([BufferSpec("q", "fifo", {})])
    assert await c1.create(BufferSpec("rt", "priority", {"capacity": 8}))
    assert not await c1.create(BufferSpec("rt", "priority", {"capacity": 8}))
    with pytest.raises(AlreadyExists):
        await c1.create(BufferSpec("rt", "priority", {"capacity": 9}))
    with pytest.raises(InvalidArgument) as err:
        await c1.create(BufferSpec("bad", "fifo", {"capacityy": 9}))
    assert err.value.field == "spec.options.capacityy"
    await c1.write("q", [exp(label=x) for x in "abc"], key="w1")
    leased = await c1.read("q", 1, max_wait=0)
    await c1.write("rt", [exp(version=2)])
    await c1.close()
    c2 = BufferCore(data)
    await c2.start([BufferSpec("q", "fifo", {})])
    assert sorted(c2.buffers) == ["q", "rt"]
    assert (await c2.write("q", [exp(label=x) for x in "abc"], key="w1")).duplicate
    st = await c2.stats("q")
    assert (st.written, st.leased, st.depth) == (3, 1, 2)
    assert await c2.ack(leased.lease_id) == 1  # leases survive a restart
    assert labels((await c2.read("q", 5, max_wait=0)).payloads) == ["b", "c"]
    assert (await c2.stats("rt")).per_model_version == {2: 1}
    await c2.close()


async def test_a_reused_key_with_other_content_is_refused_and_stores_nothing(core):
    await core.write("q", [exp(label="a"), exp(label="b")], key="k")
    for other in ([exp(label="a")], [exp(label="b"), exp(label="a")], [exp(label="a"), exp(label="c")]):
        with pytest.raises(AlreadyExists) as err:
            await core.write("q", other, key="k")
        assert err.value.field == "idempotency_key"
        assert "'k'" in err.value.message and "content differs" in err.value.message
    assert (await core.write("q", [exp(label="a"), exp(label="b")], key="k")).duplicate
    assert (await core.stats("q")).written == 2


def _maps_in_order(order: list[str]) -> pb.Experience:
    msg = exp(label="m")
    for key in order:
        msg.metrics[key] = 1.0
    return msg


async def test_map_order_of_the_sender_is_not_a_content_change(tmp_path):
    """Stored bytes are serialized deterministically: a retry from a writer whose metrics map
    iterates in another order, to a buffer restarted in between, is still a duplicate."""
    data = str(tmp_path / "d")
    c1 = BufferCore(data)
    await c1.start([BufferSpec("q", "fifo", {})])
    await c1.write("q", [_maps_in_order([f"m{i}" for i in range(20)])], key="k")
    await c1.close()
    c2 = BufferCore(data)
    await c2.start([BufferSpec("q", "fifo", {})])
    assert (await c2.write("q", [_maps_in_order([f"m{i}" for i in reversed(range(20))])], key="k")).duplicate
    await c2.close()
