"""The trainer's reads against the buffer's core (real SQLite in tmp_path): a step starts as soon as
train_batch_size rows are in the buffer, whatever the explorer's step still has to write."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from services.buffer.core import BufferCore, Defaults
from services.buffer.types import BufferSpec
from services.common.config.schema import TrinityConfig
from services.common.experience import Experience
from services.common.wire import experience_from_proto, experience_to_proto
from services.trainer.algorithms.api import ReadRequest
from services.trainer.leases import LeaseJournal
from services.trainer.ports import Status
from services.trainer.reading import LeasedReader
from trinity_grpc.common.v1 import common_pb2 as pb


@dataclass
class Read:
    lease_id: str
    experiences: list[Experience]
    end_of_data: bool


class CoreSource:
    """The trainer's ExperienceSource over an in-process BufferCore."""

    def __init__(self, core: BufferCore) -> None:
        self.core = core

    async def read(self, buffer, batch_size, *, max_wait, lease_s, min_model_version=0, reader_id=""):
        got = await self.core.read(
            buffer, batch_size, max_wait=max_wait, lease_s=lease_s, min_model_version=min_model_version
        )
        exps = [experience_from_proto(pb.Experience.FromString(p)) for p in got.payloads]
        return Read(got.lease_id, exps, got.end_of_data)

    async def nack(self, lease_id):
        await self.core.nack(lease_id)


def group(task: str, n: int = 2) -> list[pb.Experience]:
    return [
        experience_to_proto(
            Experience(tokens=np.arange(4, dtype=np.int32), prompt_length=2, model_version=0, task_id=task)
        )
        for _ in range(n)
    ]


async def test_a_step_starts_once_train_batch_size_rows_are_there_before_the_explorer_step_ends(tmp_path):
    core = BufferCore(str(tmp_path / "data"), Defaults(lease_s=30, max_batch_items=64))
    await core.start([BufferSpec("experience_buffer", "fifo", {"max_read_timeout": 30})])
    cfg = TrinityConfig.model_validate(
        {
            "checkpoint_root_dir": str(tmp_path),
            "trainer": {"read_timeout_s": 30},
            "monitor": {"monitor_type": "none"},
        }
    )
    reader = LeasedReader(
        cfg, CoreSource(core), LeaseJournal(str(tmp_path), "trainer"), asyncio.Event(), Status()
    )
    collect = asyncio.ensure_future(reader.collect([ReadRequest(source="experience", batch_size=4)], step=1))
    # an explorer step of three groups of two, written one group at a time (streaming writes)
    await core.write("experience_buffer", group("a"), key="explorer:step1:group0")
    await asyncio.sleep(0.2)
    assert not collect.done()  # 2 rows of 4: the trainer waits
    await core.write("experience_buffer", group("b"), key="explorer:step1:group1")
    got = await asyncio.wait_for(collect, 5)  # 4 rows: the step starts, group c is not written yet
    assert [e.task_id for e in got.experiences] == ["a", "a", "b", "b"]
    await core.write("experience_buffer", group("c"), key="explorer:step1:group2")
    assert (await core.stats("experience_buffer")).depth == 2  # for the next step
    await core.close()
