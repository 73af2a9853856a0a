"""The run loop against an in-memory leasing buffer: ordering, checkpoints, resume, end of data, stop."""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest
import torch

from services.common.config.schema import TrinityConfig
from services.common.experience import Experience
from services.trainer.build import build_engine
from services.trainer.checkpoint import full_checkpoint_root, list_checkpoints
from services.trainer.ports import NullSink, rows_of
from services.trainer.service import TrainerLoop
from tests.fakes.leasing_buffer import FakeBuffer, FakeRead
from tests.fakes.leasing_buffer import fixed_rows as _fixed_rows
from tests.fakes.leasing_buffer import run_loop as _run
from tests.fakes.leasing_buffer import small_cfg as _cfg
from tests.fakes.trainer import experience


async def test_trains_acks_after_each_step_and_checkpoints(tmp_path: pathlib.Path) -> None:
    cfg = _cfg(tmp_path, total_steps=3)
    buffer = FakeBuffer(rows=_fixed_rows(5))
    loop = await _run(cfg, buffer)
    assert loop.engine.step == 3
    assert buffer.events == ["read L0 4", "ack L0", "read L2 4", "ack L2", "read L4 4", "ack L4"]
    assert len(buffer.rows) == 8 and not buffer.leased
    # save_interval 2 -> step 2, plus the final step 3
    assert [s for s, _ in list_checkpoints(full_checkpoint_root(cfg.run_dir))] == [2, 3]
    lines = pathlib.Path(loop.progress_path).read_text().splitlines()
    losses = [json.loads(x)["metrics"]["actor/loss"] for x in lines]
    assert losses[-1] < losses[0]
    assert rows_of(lines)[:4] == ["0/t0-0/0", "0/t0-1/0", "0/t0-2/0", "0/t0-3/0"]
    metrics = json.loads(lines[0])["metrics"]  # peak memory of the step, its phases and the publish
    assert {"memory/step_peak_mb", "memory/forward_peak_mb", "memory/publish_peak_mb"} <= set(metrics)


async def test_resume_behind_the_newest_published_version_numbers_steps_after_it(tmp_path) -> None:
    """Checkpoint at step 0, versions up to 5 published before the crash: the next step is 6."""

    class Sink(NullSink):
        latest_version = 5
        steps: ClassVar[list[int]] = []

        async def begin_step(self, step: int) -> None:
            self.steps.append(step)

    cfg = _cfg(tmp_path, total_steps=7)
    built = build_engine(cfg, device="cpu")
    loop = TrainerLoop(cfg, built.engine, built.tokenizer, FakeBuffer(rows=_fixed_rows(2)), sink=Sink())
    await loop.run()
    assert Sink.steps == [6, 7] and loop.engine.step == 7
    lines = pathlib.Path(loop.progress_path).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [6, 7]


async def test_resume_gives_the_same_next_step_loss(tmp_path: pathlib.Path) -> None:
    straight = _cfg(tmp_path / "a", total_steps=3, save_interval=2)
    loop = await _run(straight, FakeBuffer(rows=_fixed_rows(3)))
    expected = json.loads(pathlib.Path(loop.progress_path).read_text().splitlines()[2])["metrics"]

    interrupted = _cfg(tmp_path / "b", total_steps=2, save_interval=2)
    await _run(interrupted, FakeBuffer(rows=_fixed_rows(2)))
    resumed_cfg = _cfg(tmp_path / "b", total_steps=3, save_interval=2)
    resumed = await _run(resumed_cfg, FakeBuffer(rows=_fixed_rows(1, start=2)))
    assert resumed.engine.step == 3
    got = json.loads(pathlib.Path(resumed.progress_path).read_text().splitlines()[-1])["metrics"]
    assert got["actor/loss"] == pytest.approx(expected["actor/loss"], rel=1e-6)
    assert got["actor/lr"] == expected["actor/lr"]
    assert resumed.cursor.samples == 12  # 8 before the restart + 4 after


async def test_end_of_data_trains_the_partial_batch_and_stops(tmp_path: pathlib.Path) -> None:
    cfg = _cfg(tmp_path)
    buffer = FakeBuffer(rows=_fixed_rows(1) + _fixed_rows(1, start=1)[:2], closed=True)
    loop = await _run(cfg, buffer)
    assert loop.engine.step == 2
    assert loop.status.state == "done"
    assert [s for s, _ in list_checkpoints(full_checkpoint_root(cfg.run_dir))] == [2]


async def test_untrainable_rows_are_dropped_and_acked_not_crash_looped(tmp_path) -> None:
    cfg = _cfg(tmp_path, total_steps=1)
    too_long = experience("1+1=", "2" * 300)  # builtin:tiny-arith takes 256 positions
    no_response = Experience(tokens=np.array([5, 6]), prompt_length=2, model_version=0)
    rows = _fixed_rows(1)[:2] + [too_long, no_response]
    buffer = FakeBuffer(rows=rows)
    loop = await _run(cfg, buffer)
    assert loop.engine.step == 1 and not buffer.leased
    record = json.loads(pathlib.Path(loop.progress_path).read_text().splitlines()[0])
    assert record["metrics"]["batch/dropped_rows"] == 2.0 and record["metrics"]["batch/rows"] == 2.0


async def test_final_weights_of_a_run_load_as_a_model_path(tmp_path) -> None:
    from services.models.loading import load_causal_lm
    from services.trainer.checkpoint import latest_model_dir

    cfg = _cfg(tmp_path, total_steps=1)
    assert latest_model_dir(cfg.run_dir) is None
    loop = await _run(cfg, FakeBuffer(rows=_fixed_rows(1)))
    path = latest_model_dir(cfg.run_dir)
    assert path is not None and path.parent.name == "global_step_1"
    reloaded = load_causal_lm(str(path)).state_dict()
    for name, tensor in loop.engine.model.state_dict().items():
        assert torch.equal(reloaded[name], tensor), name


async def test_sft_from_a_dataset_buffer_tokenizes_rows_and_ends_with_the_data(tmp_path) -> None:
    from services.buffer.types import TaskBatch
    from services.common.experience import Task
    from services.trainer.dataset_source import DatasetAwareSource

    rows = [{"prompt": f"{a}+{a}=", "response": str(2 * a)} for a in range(6)]

    class DatasetBuffer(FakeBuffer):
        cursor: int = 0

        async def read_tasks(self, taskset, batch_size, *, reader_id="", rewind=False):
            take = rows[self.cursor : self.cursor + batch_size]
            tasks = [
                Task(raw_task=r, task_id=f"d{self.cursor + i}", index=self.cursor + i)
                for i, r in enumerate(take)
            ]
            self.cursor += len(take)
            return TaskBatch(tasks, 0, self.cursor, end_of_data=self.cursor >= len(rows))

    cfg = TrinityConfig.model_validate(
        {
            **_cfg(tmp_path).model_dump(
                include={"checkpoint_root_dir", "mode", "algorithm", "trainer", "monitor"}
            ),
            "buffer": {
                "batch_size": 4,
                "trainer_input": {
                    "experience_buffer": {"name": "sft_data", "storage_type": "file", "path": "unused.jsonl"}
                },
            },
        }
    )
    built = build_engine(cfg, device="cpu")
    source = DatasetAwareSource(DatasetBuffer(), built.tokenizer, cfg)
    loop = TrainerLoop(cfg, built.engine, built.tokenizer, source, state=built.state)
    await loop.run()
    assert loop.engine.step == 2 and loop.cursor.samples == 6  # 4 rows, then the last 2 at end of data
    first = json.loads(pathlib.Path(loop.progress_path).read_text().splitlines()[0])
    assert first["rows"][0] == "0/d0/0" and first["metrics"]["actor/sft_loss"] > 0


@dataclass
class NamedBuffers:
    """One FakeBuffer per buffer name; records every read as (name, batch_size, min_model_version)
    and, like the real buffer, drops rows older than min_model_version instead of handing them out."""

    queues: dict[str, FakeBuffer]
    reads: list[tuple[str, int, int]] = field(default_factory=list)
    lease_owner: dict[str, str] = field(default_factory=dict)

    async def read(self, buffer, batch_size, *, max_wait, lease_s, reader_id="", min_model_version=0):
        self.reads.append((buffer, batch_size, min_model_version))
        queue = self.queues[buffer]
        queue.rows = [e for e in queue.rows if e.model_version >= min_model_version]
        got = await queue.read(buffer, batch_size, max_wait=max_wait, lease_s=lease_s, reader_id=reader_id)
        lease = f"{buffer}:{got.lease_id}" if got.lease_id else ""
        if lease:
            self.lease_owner[lease] = buffer
        return FakeRead(lease, got.experiences, got.end_of_data)

    async def ack(self, lease_id):
        await self.queues[self.lease_owner.pop(lease_id)].ack(lease_id.split(":", 1)[1])

    async def nack(self, lease_id):
        await self.queues[self.lease_owner.pop(lease_id)].nack(lease_id.split(":", 1)[1])

    async def nack_reader(self, buffer, reader_id):
        return await self.queues[buffer].nack_reader(buffer, reader_id)


def _spy_batches(loop: TrainerLoop) -> list[list[bool]]:
    """is_expert of every batch the engine trains on."""
    seen: list[list[bool]] = []
    train_step = loop.engine.train_step

    def spy(batch):
        seen.append(batch.train.is_expert.tolist())
        return train_step(batch)

    loop.engine.train_step = spy  # type: ignore[method-assign]
    return seen


async def test_mix_strategy_reads_expert_rows_from_the_auxiliary_buffer_and_marks_them(
    tmp_path: pathlib.Path,
) -> None:
    # batch 4, expert_data_ratio 0.25 -> ceil(0.25 * 4) = 1 expert row and 3 usual rows per step
    cfg = _cfg(tmp_path, total_steps=2).model_copy(deep=True)
    cfg.algorithm.sample_strategy = "mix"
    cfg.algorithm.sample_strategy_args = {"expert_data_ratio": 0.25, "sft_dataset_name": "expert"}
    cfg.buffer.trainer_input.auxiliary_buffers = {
        "expert": cfg.buffer.trainer_input.experience_buffer.model_copy(update={"name": "expert_data"})
    }
    buffers = NamedBuffers(
        {
            "experience_buffer": FakeBuffer(rows=_fixed_rows(2)),
            "expert_data": FakeBuffer(rows=_fixed_rows(2, 5)),
        }
    )
    built = build_engine(cfg, device="cpu")
    loop = TrainerLoop(cfg, built.engine, built.tokenizer, buffers, state=built.state)
    seen = _spy_batches(loop)
    await loop.run()
    assert buffers.reads == [("experience_buffer", 3, 0), ("expert_data", 1, 0)] * 2
    assert seen == [[False, False, False, True]] * 2
    assert loop.cursor.per_buffer == {"experience_buffer": 6, "expert_data": 2}
    assert not any(q.leased for q in buffers.queues.values())  # every lease of both buffers acked
    assert [q.reader_nacks for q in buffers.queues.values()] == [
        [("experience_buffer", "trainer")],
        [("expert_data", "trainer")],
    ]  # at start, both buffers were asked for leases a killed predecessor held


async def test_staleness_control_asks_for_fresh_rows_and_never_trains_older_ones(
    tmp_path: pathlib.Path,
) -> None:
    # max_staleness 1: the step about to run is s = engine.step + 1 and rows need version >= s - 1.
    # step 1 -> min 0 (all rows qualify), step 2 -> min 1, step 3 -> min 2.
    cfg = _cfg(tmp_path, total_steps=3).model_copy(deep=True)
    cfg.algorithm.sample_strategy = "staleness_control"
    cfg.algorithm.sample_strategy_args = {"max_staleness": 1}
    rows = [experience("1+2=", "3", task_id=f"v{v}-{i}", version=v) for v in (0, 0, 1, 2) for i in range(4)]
    buffers = NamedBuffers({"experience_buffer": FakeBuffer(rows=rows)})
    loop = await _run(cfg, buffers)  # type: ignore[arg-type]
    assert [min_version for _, _, min_version in buffers.reads] == [0, 1, 2]
    trained = rows_of(pathlib.Path(loop.progress_path).read_text().splitlines())
    # step 1 takes the first 4 v0 rows; step 2 skips the other 4 v0 rows (stale) and takes the v1 rows
    assert [key.split("/")[1].split("-")[0] for key in trained] == ["v0"] * 4 + ["v1"] * 4 + ["v2"] * 4
