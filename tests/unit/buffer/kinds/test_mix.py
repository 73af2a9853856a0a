"""Several training tasksets read as one: Trinity's TasksetScheduler mixing, worked by hand.

Two sets throughout: A (3 rows a0..a2) and B (2 rows b0, b1), N = 5. Trinity's epoch schedules are
numpy `default_rng(epoch).shuffle([0, 0, 0, 1, 1])`, pinned here (numpy's generator is the fact
taken as given; everything after it is derived below by hand):
    epoch 0: [A, B, B, A, A]      epoch 1: [B, A, A, A, B]
so the stream of set ids is  A B B A A | B A A A B | ...
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from services.buffer.core import BufferCore, Defaults
from services.buffer.kinds.mix import MixSchedule
from services.buffer.types import BufferSpec, MixSpec
from services.common.config.tasksets import TasksetDefaults
from services.common.errors import FailedPrecondition, InvalidArgument

EPOCH_0 = [0, 1, 1, 0, 0]
EPOCH_1 = [1, 0, 0, 0, 1]


def write_rows(path, prefix: str, n: int) -> str:
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "q": f"{prefix}{i}"}) + "\n" for i in range(n)))
    return str(path)


async def open_mix(
    tmp_path, *, a: dict | None = None, b: dict | None = None, total_epochs: int = 2, total_steps=None
) -> BufferCore:
    specs = [
        BufferSpec(
            "A",
            "taskset",
            {
                "path": write_rows(tmp_path / "a.jsonl", "a", 3),
                "default_reward_fn_type": "math_reward",
                **(a or {}),
            },
        ),
        BufferSpec(
            "B",
            "taskset",
            {
                "path": write_rows(tmp_path / "b.jsonl", "b", 2),
                "default_workflow_type": "countdown",
                **(b or {}),
            },
        ),
    ]
    core = BufferCore(
        str(tmp_path / "data"), Defaults(tasksets=TasksetDefaults(workflow="math_workflow", repeat_times=2))
    )
    await core.start(specs, [MixSpec("tasksets", ["A", "B"], total_epochs, total_steps)])
    return core


def rows(batch) -> list[str]:
    return [t.task_id for t in batch.tasks]


def test_the_pinned_epoch_schedules_are_numpys() -> None:
    schedule = MixSchedule([3, 2])
    assert schedule.order(0) == EPOCH_0 and schedule.order(1) == EPOCH_1
    ids = [0, 0, 0, 1, 1]
    np.random.default_rng(1).shuffle(ids)
    assert ids == EPOCH_1


def test_schedule_slices_positions_and_plans_by_hand() -> None:
    schedule = MixSchedule([3, 2])
    # stream positions 4..7 straddle the epochs: epoch 0's last (A), then epoch 1's B A A
    assert schedule.ids(4, 4) == [0, 1, 0, 0]
    # before position 7: epoch 0 read A three times and B twice; epoch 1's first two are B, A
    assert schedule.positions(7) == [3 + 1, 2 + 1]
    # the batch at positions 4..5 is A (its 3rd task, position 2) then B (its 3rd, position 2)
    assert schedule.plan(4, 2) == [(0, 2, 1), (1, 2, 1)]
    # at 2..3: B first (its position 1), then A (position 1): the order of first appearance
    assert schedule.plan(2, 2) == [(1, 1, 1), (0, 1, 1)]
    with pytest.raises(InvalidArgument):
        MixSchedule([3, 0])


async def test_batches_mix_by_size_wrap_each_set_and_end_after_the_epochs(tmp_path) -> None:
    core = await open_mix(tmp_path)
    got = [await core.read_tasks("tasksets", 2, reader_id="ex") for _ in range(6)]
    # positions 0-1: A B -> a0, b0 | 2-3: B A -> b1, a1 | 4-5: A | B -> a2, then B's 2nd epoch: b0
    # 6-7: A A -> a0, a1 (A's 2nd epoch) | 8-9: A B -> a2, b1 | 10: no full batch in 2 epochs (10 tasks)
    assert [rows(b) for b in got[:5]] == [
        ["a0", "b0"],
        ["b1", "a1"],
        ["a2", "b0"],
        ["a0", "a1"],
        ["a2", "b1"],
    ]
    assert [b.batch_index for b in got[:5]] == [0, 1, 2, 3, 4]
    assert [b.epoch for b in got[:5]] == [0, 0, 0, 1, 1]  # the epoch of the batch's first position
    assert got[5].end_of_data and got[5].tasks == []
    # each task keeps its own set's settings
    a0, b0 = got[0].tasks
    assert (a0.taskset, a0.workflow, a0.reward_fn, a0.repeat_times) == (
        "A",
        "math_workflow",
        "math_reward",
        2,
    )
    assert (b0.taskset, b0.workflow, b0.reward_fn) == ("B", "countdown", "")
    stats = await core.stats("tasksets")
    assert (stats.depth, stats.read, stats.end_of_data) == (5, 10, True)
    await core.close()


async def test_each_set_keeps_its_own_selector(tmp_path) -> None:
    # A shuffles with seed 42: epoch 0 is permutation(3) of default_rng(42) = [2, 1, 0], epoch 1 of
    # default_rng(43) = [1, 2, 0]; B stays sequential. A's positions 0, 1, 2, 3, 4, 5 -> rows 2 1 0 1 2 0.
    assert list(np.random.default_rng(42).permutation(3)) == [2, 1, 0]
    assert list(np.random.default_rng(43).permutation(3)) == [1, 2, 0]
    core = await open_mix(tmp_path, a={"task_selector": {"selector_type": "shuffle", "seed": 42}})
    got = [rows(await core.read_tasks("tasksets", 2, reader_id="ex")) for _ in range(5)]
    assert got == [["a2", "b0"], ["b1", "a1"], ["a0", "b0"], ["a1", "a2"], ["a0", "b1"]]
    # one count that wraps A's epoch: positions 2, 3, 4 -> rows 0 (epoch 0), then 1, 2 (epoch 1)
    assert core.taskset("A").select_from(2, 3) == [0, 1, 2]
    await core.close()


async def test_total_steps_runs_past_the_epochs(tmp_path) -> None:
    core = await open_mix(tmp_path, total_epochs=1, total_steps=4)
    got = [await core.read_tasks("tasksets", 2) for _ in range(5)]
    # 4 batches = 8 positions, past epoch 0's 5: the 4th is epoch 1's positions 6-7 (A A -> a0, a1)
    assert rows(got[3]) == ["a0", "a1"] and got[3].batch_index == 3
    assert got[4].end_of_data and not got[4].tasks
    await core.close()


async def test_a_batch_larger_than_the_epochs_is_refused(tmp_path) -> None:
    core = await open_mix(tmp_path, total_epochs=1)
    with pytest.raises(InvalidArgument) as err:
        await core.read_tasks("tasksets", 6)
    assert err.value.field == "batch_size" and "5 tasks" in str(err.value)
    await core.close()


async def test_restart_repeats_the_last_batch_then_goes_on(tmp_path) -> None:
    core = await open_mix(tmp_path)
    assert rows(await core.read_tasks("tasksets", 2, reader_id="ex")) == ["a0", "b0"]
    assert rows(await core.read_tasks("tasksets", 2, reader_id="ex")) == ["b1", "a1"]
    await core.close()
    core = await open_mix(tmp_path)  # the buffer restarts: cursors come back from <data>/tasksets.sqlite
    again = await core.read_tasks("tasksets", 2, reader_id="ex", repeat_last=True)
    assert rows(again) == ["b1", "a1"] and again.batch_index == 1
    assert rows(await core.read_tasks("tasksets", 2, reader_id="ex")) == ["a2", "b0"]
    # another reader has its own cursor
    assert rows(await core.read_tasks("tasksets", 2, reader_id="other")) == ["a0", "b0"]
    await core.close()


async def test_extension_reads_the_next_positions_under_the_same_batch(tmp_path) -> None:
    core = await open_mix(tmp_path)
    with pytest.raises(FailedPrecondition):
        await core.read_tasks("tasksets", 2, reader_id="ex", extend=True)
    first = await core.read_tasks("tasksets", 2, reader_id="ex")
    more = await core.read_tasks("tasksets", 2, reader_id="ex", extend=True)
    assert rows(more) == ["b1", "a1"] and more.batch_index == first.batch_index == 0
    # repeating the batch starts from its first position again; the extension follows it again
    assert rows(await core.read_tasks("tasksets", 2, reader_id="ex", repeat_last=True)) == ["a0", "b0"]
    assert rows(await core.read_tasks("tasksets", 2, reader_id="ex", extend=True)) == ["b1", "a1"]
    nxt = await core.read_tasks("tasksets", 2, reader_id="ex")
    assert rows(nxt) == ["a2", "b0"] and nxt.batch_index == 1
    await core.close()


async def test_difficulty_based_member_takes_feedback_under_its_own_name(tmp_path) -> None:
    core = await open_mix(tmp_path, b={"task_selector": {"selector_type": "difficulty_based"}})
    await core.report_feedback("B", [("b0", 1.0)])
    assert core.taskset("B").pass_rates == {0: 1.0}
    with pytest.raises(InvalidArgument):
        await core.report_feedback("A", [("b0", 1.0)])  # b0 is not A's
    await core.close()


async def test_a_mix_needs_training_tasksets_and_a_free_name(tmp_path) -> None:
    path = write_rows(tmp_path / "a.jsonl", "a", 3)
    core = BufferCore(str(tmp_path / "data"))
    await core.start(
        [
            BufferSpec("A", "taskset", {"path": path}),
            BufferSpec("E", "taskset", {"path": path, "is_eval": True}),
        ]
    )
    with pytest.raises(InvalidArgument, match="eval tasksets"):
        await core.create_mix(MixSpec("mix", ["A", "E"]))
    with pytest.raises(InvalidArgument, match="taken"):
        await core.create_mix(MixSpec("A", ["A"]))
    await core.close()
