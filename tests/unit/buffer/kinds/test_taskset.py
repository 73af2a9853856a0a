"""Tasksets: file formats, epochs, drop-last / keep-last, selectors, persisted cursors."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.buffer.core import BufferCore, Defaults
from services.buffer.types import BufferSpec
from services.common.config.tasksets import TasksetDefaults
from services.common.errors import InvalidArgument


def write_jsonl(path, n: int) -> str:
    path.write_text(
        "".join(json.dumps({"id": f"t{i}", "question": f"q{i}", "answer": str(i)}) + "\n" for i in range(n))
    )
    return str(path)


async def open_core(tmp_path, *specs: BufferSpec, defaults: Defaults | None = None) -> BufferCore:
    core = BufferCore(
        str(tmp_path / "data"),
        defaults or Defaults(tasksets=TasksetDefaults(workflow="math_workflow", repeat_times=4)),
    )
    await core.start(list(specs))
    return core


def ids(batch) -> list[int]:
    return [t.index for t in batch.tasks]


async def test_training_drops_last_eval_keeps_last_and_task_fields(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", 10)
    opts = {
        "path": path,
        "total_epochs": 2,
        "format": {"prompt_key": "question", "response_key": "answer"},
        "rollout_args": {"temperature": 0.7},
        "default_reward_fn_type": "math_reward",
    }
    core = await open_core(
        tmp_path,
        BufferSpec("train", "taskset", opts),
        BufferSpec("eval", "taskset", {"path": path, "is_eval": True}),
    )
    got = [await core.read_tasks("train", 4) for _ in range(5)]
    assert [ids(b) for b in got[:4]] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert [b.epoch for b in got[:4]] == [0, 0, 1, 1] and [b.batch_index for b in got[:4]] == [0, 1, 2, 3]
    assert got[4].end_of_data and got[4].tasks == []
    task = got[0].tasks[0]
    assert (task.workflow, task.reward_fn, task.repeat_times, task.task_id) == (
        "math_workflow",
        "math_reward",
        4,
        "t0",
    )
    assert task.raw_task["question"] == "q0" and task.format_args["prompt_key"] == "question"
    assert task.rollout_args == {"temperature": 0.7} and not task.is_eval
    evals = [await core.read_tasks("eval", 4) for _ in range(4)]
    assert [ids(b) for b in evals[:3]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and evals[3].end_of_data
    assert evals[0].tasks[0].is_eval and evals[0].tasks[0].repeat_times == 1
    assert ids(await core.read_tasks("eval", 4, rewind=True)) == [0, 1, 2, 3]
    await core.close()


async def test_shuffle_reseeded_per_epoch_and_cursor_survives_restart(tmp_path):
    spec = BufferSpec(
        "ts",
        "taskset",
        {
            "path": write_jsonl(tmp_path / "t.jsonl", 8),
            "total_steps": 6,
            "task_selector": {"selector_type": "shuffle", "seed": 7},
        },
    )
    core = await open_core(tmp_path, spec)
    first = [ids(await core.read_tasks("ts", 4, reader_id="explorer")) for _ in range(3)]
    await core.close()
    assert sorted(first[0] + first[1]) == list(range(8)) and first[0] + first[1] != list(range(8))
    core = await open_core(tmp_path, spec)
    rest = [await core.read_tasks("ts", 4, reader_id="explorer") for _ in range(4)]
    await core.close()
    assert [b.batch_index for b in rest[:3]] == [3, 4, 5] and rest[3].end_of_data  # total_steps = 6
    epoch1 = first[2] + ids(rest[0])
    assert sorted(epoch1) == list(range(8)) and epoch1 != first[0] + first[1]  # a new permutation
    again = await open_core(tmp_path / "other", spec)  # same seed, fresh cursor: same order
    assert ids(await again.read_tasks("ts", 4)) == first[0]
    await again.close()


async def test_parquet_in_hf_layout_honours_split_and_subset(tmp_path):
    root = tmp_path / "ds"
    (root / "main" / "data").mkdir(parents=True)
    for split, n in (("train", 5), ("test", 3)):
        table = pa.table({"prompt": [f"{split}{i}" for i in range(n)]})
        pq.write_table(table, root / "main" / "data" / f"{split}-00000-of-00001.parquet")
    core = await open_core(
        tmp_path,
        BufferSpec(
            "ts", "taskset", {"path": str(root), "subset_name": "main", "split": "test", "is_eval": True}
        ),
    )
    batch = await core.read_tasks("ts", 10)
    assert [t.raw_task["prompt"] for t in batch.tasks] == ["test0", "test1", "test2"]
    with pytest.raises(InvalidArgument) as err:
        await core.create(
            BufferSpec("bad", "taskset", {"path": str(root), "subset_name": "main", "split": "dev"})
        )
    assert err.value.field == "split"
    await core.close()


async def test_random_and_difficulty_based_selectors(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", 4)
    core = await open_core(
        tmp_path,
        BufferSpec(
            "rnd", "taskset", {"path": path, "total_steps": 50, "task_selector": {"selector_type": "random"}}
        ),
        BufferSpec(
            "hard",
            "taskset",
            {
                "path": path,
                "total_steps": 40,
                "task_selector": {
                    "selector_type": "difficulty_based",
                    "target_pass_rate": 0.5,
                    "temperature": 0.05,
                },
            },
        ),
    )
    seen: Counter[int] = Counter()
    for _ in range(50):
        seen.update(ids(await core.read_tasks("rnd", 2)))
    assert set(seen) == {0, 1, 2, 3}
    await core.report_feedback("hard", [("t0", 1.0), ("t1", 0.5), ("t2", 0.0), ("t3", 1.0)])
    picks: Counter[int] = Counter()
    for _ in range(40):
        picks.update(ids(await core.read_tasks("hard", 1)))
    assert picks[1] >= 36  # weight 1 vs e^-10 for the others
    with pytest.raises(InvalidArgument) as err:
        await core.report_feedback("hard", [("t9", 0.5)])
    assert err.value.field == "feedback[0].task_id"
    with pytest.raises(InvalidArgument) as err:
        await core.read_tasks("rnd", 5)  # larger than the training taskset
    assert err.value.field == "batch_size"
    await core.close()


async def test_repeat_last_hands_a_restarted_reader_its_last_batch_again(tmp_path):
    spec = BufferSpec(
        "ts",
        "taskset",
        {
            "path": write_jsonl(tmp_path / "t.jsonl", 12),
            "task_selector": {"selector_type": "shuffle", "seed": 3},
        },
    )
    core = await open_core(tmp_path, spec)
    fresh = await core.read_tasks("ts", 4, reader_id="explorer", repeat_last=True)  # nothing to repeat yet
    assert fresh.batch_index == 0
    second = await core.read_tasks("ts", 4, reader_id="explorer")
    await core.close()  # the reader dies before finishing batch 1; the buffer restarts too

    core = await open_core(tmp_path, spec)
    again = await core.read_tasks("ts", 4, reader_id="explorer", repeat_last=True)
    assert (again.batch_index, ids(again)) == (second.batch_index, ids(second)) == (1, ids(second))
    # repeating does not move the cursor past the batch after it, nor count tasks twice
    after = await core.read_tasks("ts", 4, reader_id="explorer")
    assert after.batch_index == 2 and sorted(ids(fresh) + ids(second) + ids(after)) == list(range(12))
    assert core.taskset("ts").stats()["read"] == 12
    other = await core.read_tasks("ts", 4, reader_id="other", repeat_last=True)  # per reader
    assert other.batch_index == 0
    await core.close()


async def test_extend_reads_on_within_the_batch_and_a_repeat_reads_the_same_extensions(tmp_path):
    """Refill (dynamic sampling): extensions take the tasks after the cursor under the batch's
    index; total_steps counts batches, not extensions; repeat_last goes back to the batch's start,
    so a restarted reader reads the batch and then the same extensions again."""
    from services.common.errors import FailedPrecondition

    spec = BufferSpec("ts", "taskset", {"path": write_jsonl(tmp_path / "t.jsonl", 10), "total_steps": 2})
    core = await open_core(tmp_path, spec)
    with pytest.raises(FailedPrecondition):  # nothing handed yet to extend
        await core.read_tasks("ts", 4, reader_id="explorer", extend=True)
    first = await core.read_tasks("ts", 4, reader_id="explorer")
    more = await core.read_tasks("ts", 4, reader_id="explorer", extend=True)
    wrap = await core.read_tasks("ts", 4, reader_id="explorer", extend=True)  # 2 left: next epoch
    assert [ids(first), ids(more), ids(wrap)] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert [b.batch_index for b in (first, more, wrap)] == [0, 0, 0] and wrap.epoch == 1
    await core.close()  # killed before the step ended; the buffer restarts too

    core = await open_core(tmp_path, spec)
    again = await core.read_tasks("ts", 4, reader_id="explorer", repeat_last=True)
    again_more = await core.read_tasks("ts", 4, reader_id="explorer", extend=True)
    assert (again.batch_index, ids(again), ids(again_more)) == (0, [0, 1, 2, 3], [4, 5, 6, 7])
    second = await core.read_tasks("ts", 4, reader_id="explorer")
    assert (second.batch_index, ids(second)) == (1, [0, 1, 2, 3])  # epoch 1: 8 + 4 > 10 rolled over
    assert (await core.read_tasks("ts", 4, reader_id="explorer", extend=True)).batch_index == 1
    assert (await core.read_tasks("ts", 4, reader_id="explorer")).end_of_data  # total_steps 2 batches
    with pytest.raises(InvalidArgument):
        await core.read_tasks("ts", 4, reader_id="explorer", extend=True, repeat_last=True)
    await core.close()


async def test_extend_ends_with_the_epochs_and_seeds_random_extensions_apart(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", 8)
    core = await open_core(
        tmp_path,
        BufferSpec("seq", "taskset", {"path": path}),
        BufferSpec("rnd", "taskset", {"path": path, "task_selector": {"selector_type": "random"}}),
    )
    await core.read_tasks("seq", 4, reader_id="x")
    assert ids(await core.read_tasks("seq", 4, reader_id="x", extend=True)) == [4, 5, 6, 7]
    end = await core.read_tasks("seq", 4, reader_id="x", extend=True)  # total_epochs 1
    assert end.end_of_data and end.tasks == [] and end.batch_index == 0
    batch = await core.read_tasks("rnd", 4, reader_id="x")
    ext = await core.read_tasks("rnd", 4, reader_id="x", extend=True)
    nxt = await core.read_tasks("rnd", 4, reader_id="x")
    assert ids(ext) != ids(nxt) and ids(ext) != ids(batch)  # not the next batch's draw
    await core.close()


async def test_offline_easy2hard_reads_highest_feature_first_every_epoch(tmp_path):
    # pass rates (higher = easier): t0 0.2, t1 0.9, t2 0.5, t3 0.9 (tie with t1, second key decides),
    # t4 0.0; second column breaks the tie: t3 0.7 > t1 0.1 -> order t3, t1, t2, t0, t4
    rows = [(0.2, 0.0), (0.9, 0.1), (0.5, 0.0), (0.9, 0.7), (0.0, 0.0)]
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "question": "q", "p": a, "s": b}) + "\n"
            for i, (a, b) in enumerate(rows)
        )
    )
    spec = BufferSpec(
        "ts",
        "taskset",
        {
            "path": str(path),
            "total_epochs": 2,
            "task_selector": {"selector_type": "offline_easy2hard", "feature_keys": ["p", "s"]},
        },
    )
    core = await open_core(tmp_path, spec)
    batches = [ids(await core.read_tasks("ts", 2)) for _ in range(4)]
    await core.close()
    # training drops the last partial batch of each epoch (t4 alone)
    assert batches == [[3, 1], [2, 0], [3, 1], [2, 0]]
    path.write_text(json.dumps({"id": "x", "question": "q", "p": "easy", "s": 1}) + "\n")
    with pytest.raises(InvalidArgument, match="'p' must be a finite number") as err:
        await open_core(tmp_path / "bad", spec)
    assert err.value.field == "feature_keys"


def test_offline_easy2hard_needs_feature_keys():
    from services.common.config.buffer import TaskSelectorConfig

    with pytest.raises(ValueError, match="offline_easy2hard sorts the tasks by feature_keys"):
        TaskSelectorConfig(selector_type="offline_easy2hard")
