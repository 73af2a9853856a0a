"""The trainer loop's leases against an in-memory leasing buffer: a killed trainer's leases come back,
a stop with the buffer gone defers acks to the next trainer, outages are retried."""

from __future__ import annotations

import asyncio
import json
import pathlib
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import NotFound, Unavailable
from services.trainer.build import build_engine
from services.trainer.checkpoint import full_checkpoint_root, list_checkpoints
from services.trainer.ports import rows_of
from services.trainer.service import TrainerLoop
from tests.fakes.leasing_buffer import FakeBuffer
from tests.fakes.leasing_buffer import fixed_rows as _fixed_rows
from tests.fakes.leasing_buffer import run_loop as _run
from tests.fakes.leasing_buffer import small_cfg as _cfg


async def test_leases_of_a_killed_trainer_are_returned_at_restart(tmp_path: pathlib.Path) -> None:
    """A trainer killed while holding a lease leaves it in its journal; the next run nacks it first."""
    cfg = _cfg(tmp_path, total_steps=1)
    buffer = FakeBuffer(rows=_fixed_rows(2))
    held = await buffer.read("b", 4, max_wait=0, lease_s=600)  # what the killed trainer read
    journal = pathlib.Path(cfg.run_dir) / "trainer" / "leases-trainer.json"
    journal.parent.mkdir(parents=True)
    journal.write_text(json.dumps([held.lease_id, "gone:lease"]))
    buffer.events.clear()

    async def nack(lease_id):  # an unknown lease (expired or acked) is reported, not fatal
        if lease_id not in buffer.leased:
            raise NotFound(f"no lease {lease_id}", field="lease_id")
        await FakeBuffer.nack(buffer, lease_id)

    buffer.nack = nack  # type: ignore[method-assign]
    loop = await _run(cfg, buffer)
    assert buffer.events[:2] == [f"nack {held.lease_id}", "read L1 4"]
    lines = pathlib.Path(loop.progress_path).read_text().splitlines()
    assert rows_of(lines) == ["0/t0-0/0", "0/t0-1/0", "0/t0-2/0", "0/t0-3/0"]  # the returned rows
    assert json.loads(journal.read_text()) == {}  # acked: nothing held any more


async def test_a_lease_the_killed_trainer_never_journaled_is_returned_by_reader_id(tmp_path) -> None:
    """Killed after the buffer committed its Read but before journaling the lease: the next trainer
    asks the buffer for every lease of its reader id, so it need not wait out buffer.lease_s."""
    cfg = _cfg(tmp_path, total_steps=1)
    buffer = FakeBuffer(rows=_fixed_rows(2))
    await buffer.read("experience_buffer", 4, max_wait=0, lease_s=600, reader_id="trainer")  # t0-*
    other = await buffer.read("experience_buffer", 4, max_wait=0, lease_s=600, reader_id="someone-else")
    buffer.events.clear()
    loop = await asyncio.wait_for(_run(cfg, buffer), 60)  # without the return: waits for data forever
    assert buffer.reader_nacks == [("experience_buffer", "trainer")]
    lines = pathlib.Path(loop.progress_path).read_text().splitlines()
    assert rows_of(lines) == ["0/t0-0/0", "0/t0-1/0", "0/t0-2/0", "0/t0-3/0"]  # the returned rows
    assert list(buffer.leased) == [other.lease_id]  # another reader's lease is left alone


async def test_reader_leases_of_a_buffer_that_cannot_return_them_do_not_stop_the_start(tmp_path) -> None:
    """An auxiliary buffer the buffer service does not know (or a dataset buffer) is logged and skipped."""
    cfg = _cfg(tmp_path, total_steps=1).model_copy(deep=True)
    cfg.buffer.trainer_input.auxiliary_buffers = {
        "gone": cfg.buffer.trainer_input.experience_buffer.model_copy(update={"name": "gone"})
    }
    buffer = FakeBuffer(rows=_fixed_rows(1))
    asked = buffer.nack_reader

    async def nack_reader(name, reader_id):
        if name == "gone":
            raise NotFound(f"no buffer named {name!r}", field="buffer")
        return await asked(name, reader_id)

    buffer.nack_reader = nack_reader  # type: ignore[method-assign]
    loop = await _run(cfg, buffer)
    assert loop.engine.step == 1 and buffer.reader_nacks == [("experience_buffer", "trainer")]


async def test_stop_while_waiting_returns_leases_and_saves(tmp_path: pathlib.Path) -> None:
    cfg = _cfg(tmp_path, total_steps=10)
    buffer = FakeBuffer(rows=_fixed_rows(1) + _fixed_rows(1, start=1)[:2])  # 1.5 batches, never closed
    built = build_engine(cfg, device="cpu")
    loop = TrainerLoop(cfg, built.engine, built.tokenizer, buffer)
    task = asyncio.create_task(loop.run())
    for _ in range(500):
        if loop.status.state == "waiting_for_data":
            break
        await asyncio.sleep(0.01)
    loop.request_stop()
    await asyncio.wait_for(task, 30)
    assert loop.engine.step == 1
    assert buffer.events[-1].startswith("nack")  # the half batch goes back unacked
    assert len(buffer.rows) == 2 and not buffer.leased
    assert [s for s, _ in list_checkpoints(full_checkpoint_root(cfg.run_dir))] == [1]


@dataclass
class GoneAtAck(FakeBuffer):
    """The buffer goes away as the first step's rows are trained: acks fail with UNAVAILABLE and the
    whole run is stopping (on_gone asks the loop to stop) until `gone` is cleared."""

    gone: bool = True
    on_gone: Any = None

    async def ack(self, lease_id):
        if self.gone:
            self.on_gone()
            raise Unavailable("buffer stopping")
        await super().ack(lease_id)


async def test_a_stop_with_the_buffer_gone_defers_the_ack_to_the_next_trainer(tmp_path, monkeypatch) -> None:
    """Stopping with an unreachable buffer: the trainer waits shutdown_grace_s for the ack, not
    lease_s; it saves step 1 and journals the lease as trained at step 1. The next trainer resumes
    from step 1, so it acks that lease instead of giving its rows back to be trained again."""
    monkeypatch.setattr("services.trainer.reading.RETRY_DELAY_S", 0.01)
    cfg = _cfg(tmp_path, total_steps=2)
    cfg.services.shutdown_grace_s = 0.2
    buffer = GoneAtAck(rows=_fixed_rows(2))
    built = build_engine(cfg, device="cpu")
    loop = TrainerLoop(cfg, built.engine, built.tokenizer, buffer, state=built.state)
    buffer.on_gone = loop.request_stop
    await asyncio.wait_for(loop.run(), 30)  # lease_s is 600: only the stop-time bound ends the wait
    assert loop.engine.step == 1
    [lease] = buffer.leased
    journal = pathlib.Path(cfg.run_dir) / "trainer" / "leases-trainer.json"
    assert json.loads(journal.read_text()) == {lease: 1}
    assert [s for s, _ in list_checkpoints(full_checkpoint_root(cfg.run_dir))] == [1]

    buffer.gone = False
    buffer.events.clear()
    again = await _run(_cfg(tmp_path, total_steps=2), buffer)
    assert again.engine.step == 2
    assert buffer.events[:2] == [f"ack {lease}", "read L1 4"]  # acked first, then the second batch
    trained = rows_of(pathlib.Path(again.progress_path).read_text().splitlines())
    assert len(trained) == len(set(trained)) == 8  # steps 1 and 2 in one progress file: each row once
    assert not buffer.leased and not buffer.rows and json.loads(journal.read_text()) == {}


async def test_a_lease_trained_after_the_resumed_checkpoint_is_given_back(tmp_path) -> None:
    """Trained at step 3 but the newest checkpoint is step 2 (killed before saving): that update is
    lost, so the rows go back to the buffer rather than being acked."""
    cfg = _cfg(tmp_path, total_steps=2)
    buffer = FakeBuffer(rows=_fixed_rows(3))
    await _run(cfg, buffer)  # steps 1-2, checkpoint 2
    held = await buffer.read("b", 4, max_wait=0, lease_s=600)
    journal = pathlib.Path(cfg.run_dir) / "trainer" / "leases-trainer.json"
    journal.write_text(json.dumps({held.lease_id: 3}))
    buffer.events.clear()
    await _run(_cfg(tmp_path, total_steps=3), buffer)
    assert buffer.events[:2] == [f"nack {held.lease_id}", "read L1 4"]


@dataclass
class FlakyBuffer(FakeBuffer):
    """Fails the first read and the first ack with UNAVAILABLE, and says the third lease expired."""

    failures: list[str] = field(default_factory=lambda: ["read", "ack"])
    acks: int = 0

    async def read(self, *args, **kwargs):
        if "read" in self.failures:
            self.failures.remove("read")
            raise Unavailable("buffer restarting")
        return await super().read(*args, **kwargs)

    async def ack(self, lease_id):
        if "ack" in self.failures:
            self.failures.remove("ack")
            raise Unavailable("buffer restarting")
        self.acks += 1
        if self.acks == 3:
            raise NotFound(f"lease {lease_id} expired")
        await super().ack(lease_id)


async def test_buffer_outages_are_retried_and_a_lost_lease_is_survived(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("services.trainer.reading.RETRY_DELAY_S", 0.0)
    cfg = _cfg(tmp_path, total_steps=3)
    buffer = FlakyBuffer(rows=_fixed_rows(3))
    loop = await _run(cfg, buffer)
    assert loop.engine.step == 3 and not buffer.failures
    assert buffer.acks == 3
