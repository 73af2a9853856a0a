"""Dynamic sampling's refill on hand-worked sequences: the rounds a step runs, what it writes, the
cap, the end of the taskset, a restart mid-step, and two explorers on one taskset."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

from services.common.config.schema import TrinityConfig
from services.common.experience import Experience
from services.explorer.build import build_pool, build_runner
from services.explorer.explorer import Explorer
from services.explorer.pipeline.operators import PipelineOutput
from services.explorer.refill import Round, lockstep, merge_round_metrics, sample_step
from services.explorer.runner import VersionRef
from services.explorer.workflows import WORKFLOWS, Workflow
from services.explorer.workflows.base import WorkflowExperience
from services.models.loading import load_tokenizer
from tests.fakes.explorer import FakeBuffer, FakeWeightSync, RecordingMonitor

# ---- sample_step alone ----------------------------------------------------------------------------


def kept_round(*groups: str, raw: int = 4, dropped: int = 0) -> Round:
    exps = [
        Experience(tokens=np.arange(3), prompt_length=1, model_version=0, group_id=g)
        for g in groups
        for _ in (0, 1)
    ]
    out = PipelineOutput(exps, {"pipeline/0_f/filtered_count": float(dropped), "pipeline/0_f/ratio": 0.5})
    out.dropped = Counter({"f": dropped} if dropped else {})
    return Round([], [], out, 1.0)


def rounds_from(script: list[Round]):
    calls: list[int] = []

    async def more(index: int) -> Round | None:
        calls.append(index)
        return script.pop(0) if script else None

    return more, calls


async def test_refill_runs_rounds_until_the_groups_are_there_and_trims_the_overshoot():
    # wanted 3: round 0 keeps 1 group, round 1 none, round 2 three -> 4 > 3: round 2's last group goes
    more, calls = rounds_from([kept_round(dropped=4), kept_round("b", "c", "d")])
    step = await sample_step(kept_round("a", dropped=2), more=more, wanted=3, max_rounds=10, step=1)
    assert calls == [1, 2]
    assert [e.group_id for e in step.experiences] == ["a", "a", "b", "b", "c", "c"]
    assert step.dropped == {"f": 6, "refill_surplus": 2}
    assert step.metrics["rollout/num_gen_batches"] == 3.0 and step.metrics["rollout/groups"] == 3.0
    assert step.metrics["rollout/refill_cap_reached"] == 0.0
    assert step.metrics["rollout/dropped/refill_surplus"] == 2.0
    assert step.metrics["pipeline/0_f/filtered_count"] == 6.0  # counts add up over the rounds
    assert step.rollout_seconds == 3.0


async def test_refill_stops_at_the_cap_or_the_end_and_keeps_what_it_has(capsys):
    more, calls = rounds_from([kept_round(dropped=4), kept_round("z")])
    step = await sample_step(kept_round("a"), more=more, wanted=3, max_rounds=2, step=7)
    assert calls == [1] and len(step.rounds) == 2 and step.metrics["rollout/refill_cap_reached"] == 1.0
    assert [e.group_id for e in step.experiences] == ["a", "a"] and step.metrics["rollout/groups"] == 1.0
    assert "refill_cap_reached" in capsys.readouterr().out
    more, calls = rounds_from([kept_round("b")])  # then the taskset ends
    step = await sample_step(kept_round("a"), more=more, wanted=3, max_rounds=0, step=1)  # 0: no cap
    assert calls == [1, 2] and step.metrics["rollout/groups"] == 2.0
    assert step.metrics["rollout/refill_cap_reached"] == 0.0


async def test_no_refill_without_a_refilling_operator_or_when_the_first_round_is_full():
    more, calls = rounds_from([kept_round("b")])
    alone = await sample_step(kept_round("a", dropped=2), more=more, wanted=3, max_rounds=1, step=1)
    assert calls == [] and "rollout/num_gen_batches" not in alone.metrics  # max_rounds 1: as before
    full = await sample_step(kept_round("a", "b", "c", "d"), more=more, wanted=3, max_rounds=5, step=1)
    assert calls == [] and len(full.experiences) == 8  # round 0 is never trimmed (e.g. 2 groups a task)


def test_round_metrics_merge():
    merged = merge_round_metrics(
        [
            (4, {"p/0_x/filtered_count": 2.0, "p/0_x/dropped_all_wrong": 2.0, "p/0_x/mean": 1.0}),
            (12, {"p/0_x/filtered_count": 6.0, "p/0_x/dropped_all_wrong": 4.0, "p/0_x/mean": 3.0}),
        ]
    )
    # counts add; a mean is weighted by the rounds' experiences: (4*1 + 12*3) / 16 = 2.5
    assert merged == {"p/0_x/filtered_count": 8.0, "p/0_x/dropped_all_wrong": 6.0, "p/0_x/mean": 2.5}


# ---- the explorer on a scripted taskset ----------------------------------------------------------

RIGHT, WRONG, MIXED = [1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]


class ScriptedOutcomes(Workflow):
    """Every run's accuracy is the task's `outcomes[run]` (no model call): groups are hand-worked."""

    can_repeat = True

    def run(self) -> list[Experience]:
        out = []
        for run in range(self.task.repeat_times):
            score = self.task.raw_task["outcomes"][run]
            out.append(
                WorkflowExperience(
                    tokens=np.array([1, 2, 3, 4]), prompt_length=2, reward=score, metrics={"accuracy": score}
                )
            )
        return out


WORKFLOWS.register_module("scripted_outcomes_workflow", ScriptedOutcomes, force=True)


def make_cfg(name: str = "explorer", sync: dict | None = None, **explorer) -> TrinityConfig:
    return TrinityConfig.model_validate(
        {
            "synchronizer": sync or {},
            "algorithm": {"algorithm_type": "dapo", "repeat_times": 2},
            "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 16, "max_response_tokens": 4},
            "buffer": {
                "batch_size": 2,
                "explorer_input": {
                    "taskset": {"name": "tasks", "default_workflow_type": "scripted_outcomes_workflow"}
                },
            },
            "data_processor": {"experience_pipeline": {"operators": [{"name": "dapo_dynamic_sampling"}]}},
            "explorer": {"name": name, "runner_per_model": 2, "eval_on_startup": False, **explorer},
            "monitor": {"monitor_type": "none"},
        }
    )


@pytest.fixture
def explorer_for():
    built = []

    def make(cfg, buffer):
        buffer.cfg = buffer.cfg or cfg
        tok = load_tokenizer(cfg.model.model_path)
        pool = build_pool(cfg, tok)
        runner = build_runner(cfg, pool, tok, VersionRef(), [])
        monitor = RecordingMonitor()
        built.append((pool, runner))
        return Explorer(
            cfg, buffer=buffer, weights=FakeWeightSync(pool), runner=runner, monitor=monitor
        ), monitor

    yield make
    for pool, runner in built:
        runner.close()
        pool.close()


def taskset(*outcomes: list[float]) -> FakeBuffer:
    return FakeBuffer({"tasks": [{"outcomes": o} for o in outcomes]})


# tasks 0..9: step 1 reads 0,1 (right, wrong: nothing kept), extends to 2,3 (one kept), then 4,5
# (two kept: 3 > 2, task 5's group is the surplus); step 2 reads 6,7 (both wrong), extends to 8,9.
SCRIPT = (RIGHT, WRONG, MIXED, RIGHT, MIXED, MIXED, WRONG, WRONG, MIXED, MIXED)


async def test_a_step_refills_until_it_has_batch_size_groups(explorer_for):
    buffer = taskset(*SCRIPT)
    explorer, monitor = explorer_for(make_cfg(), buffer)
    await explorer.run()
    written = buffer.written["experience_buffer"]
    assert [(e.batch_id, e.task_id) for e in written] == [(1, "2"), (1, "2"), (1, "4"), (1, "4")] + [
        (2, "8"),
        (2, "8"),
        (2, "9"),
        (2, "9"),
    ]
    assert buffer.extensions == [("tasks", 0), ("tasks", 0), ("tasks", 1)]  # steps are batch indices
    assert len({e.group_id for e in written}) == 4  # round 1's task 2 is group ".../1.1/tasks/2"
    step1, step2 = (m for s, m in monitor.logged if "rollout/num_gen_batches" in m)
    assert (step1["rollout/num_gen_batches"], step2["rollout/num_gen_batches"]) == (3.0, 2.0)
    assert step1["rollout/experiences"] == 12.0 and step1["rollout/written"] == 4.0
    assert step1["pipeline/0_dapo_dynamic_sampling/dropped_all_correct"] == 4.0  # tasks 0 and 3
    assert step1["rollout/dropped/dapo_dynamic_sampling/all_wrong"] == 2.0  # task 1
    assert step1["rollout/dropped/refill_surplus"] == 2.0  # task 5
    assert step2["rollout/dropped/dapo_dynamic_sampling/all_wrong"] == 4.0  # tasks 6 and 7


ASYNC = {"sync_style": "fully_async", "sync_method": "checkpoint"}  # the explorer never waits: short is fine


async def test_the_cap_and_the_end_of_the_taskset_leave_a_step_short(explorer_for, capsys):
    buffer = taskset(*SCRIPT)
    explorer, monitor = explorer_for(make_cfg(sync=ASYNC, max_num_gen_batches=2), buffer)
    await explorer.run()
    by_step = [m for _, m in monitor.logged if "rollout/num_gen_batches" in m]
    # step 1: tasks 0-3, one group, cap; step 2: 4,5 full at once; step 3: 6,7 + 8,9
    assert [m["rollout/groups"] for m in by_step] == [1.0, 2.0, 2.0]
    assert [m["rollout/refill_cap_reached"] for m in by_step] == [1.0, 0.0, 0.0]
    assert "refill_cap_reached" in capsys.readouterr().out
    no_refill = taskset(*SCRIPT)
    explorer, monitor = explorer_for(make_cfg(sync=ASYNC, max_num_gen_batches=1), no_refill)
    await explorer.run()  # Trinity's behaviour: each batch is a step, whatever the filter keeps
    # 5 steps of 2 tasks keep the groups of tasks 2 | 4, 5 | 8, 9: 5 groups of 2
    assert no_refill.extensions == [] and len(no_refill.written["experience_buffer"]) == 5 * 2
    ends = taskset(RIGHT, RIGHT, MIXED, RIGHT)
    explorer, monitor = explorer_for(make_cfg(), ends)
    await explorer.run()
    assert [e.task_id for e in ends.written["experience_buffer"]] == ["2", "2"]  # the taskset ended


async def test_where_steps_wait_for_versions_the_cap_is_passed_so_the_trainer_never_starves(
    explorer_for, capsys
):
    # on-policy: step 2 waits for the update of step 1's rows; step 1 stopping short at the cap
    # (tasks 0-3, one group) would stall the trainer, so it samples on (4,5: full, 5 the surplus)
    buffer = taskset(*SCRIPT)
    explorer, monitor = explorer_for(make_cfg(max_num_gen_batches=2), buffer)
    await explorer.run()
    by_step = [m for _, m in monitor.logged if "rollout/num_gen_batches" in m]
    assert [m["rollout/groups"] for m in by_step] == [2.0, 2.0]
    assert [m["rollout/num_gen_batches"] for m in by_step] == [3.0, 2.0]
    assert by_step[0]["rollout/refill_cap_reached"] == 1.0  # still reported
    out = capsys.readouterr().out
    assert "refill_cap_passed" in out and '"refill_cap_reached"' not in out
    one = taskset(*SCRIPT)  # max_num_gen_batches 1 too: a step is never short on-policy
    explorer, monitor = explorer_for(make_cfg(max_num_gen_batches=1), one)
    await explorer.run()
    assert [e.task_id for e in one.written["experience_buffer"]][:4] == ["2", "2", "4", "4"]


def test_lockstep_is_every_style_but_fully_async_with_a_trainer():
    assert lockstep(make_cfg()) and lockstep(make_cfg(sync={"sync_offset": 1, "sync_interval": 2}))
    assert not lockstep(make_cfg(sync=ASYNC))
    cfg = make_cfg()
    assert not lockstep(cfg.model_copy(update={"mode": "explore"}))


async def test_a_restart_mid_step_reads_the_same_extensions_and_writes_the_same_groups(explorer_for):
    """A predecessor was handed step 1's batch (tasks 0,1) and one extension (2,3), then died: the
    repeat_last cursor is the batch's start. Its successor redoes step 1 on the same tasks."""
    buffer = taskset(*SCRIPT)
    key = ("tasks", "explorer")
    buffer.cursors[key], buffer.previous[key], buffer.index[key] = 4, 0, 0
    explorer, _ = explorer_for(make_cfg(), buffer)
    await explorer.run()
    assert explorer.replayed_step == 1
    assert [e.task_id for e in buffer.written["experience_buffer"]] == [
        "2",
        "2",
        "4",
        "4",
        "8",
        "8",
        "9",
        "9",
    ]
    # had the predecessor written step 1 already, the same keys and content would add nothing
    again = taskset(*SCRIPT)
    again.cursors[key], again.previous[key], again.index[key] = 6, 0, 0
    again.keys = {k: v for k, v in buffer.keys.items() if ":step1:" in k}
    again.written = {"experience_buffer": list(buffer.written["experience_buffer"][:4])}
    explorer, _ = explorer_for(make_cfg(), again)
    await explorer.run()
    assert [e.task_id for e in again.written["experience_buffer"]] == ["2", "2", "4", "4", "8", "8", "9", "9"]


async def test_two_explorers_refill_on_their_own_cursors(explorer_for):
    buffer = taskset(*SCRIPT)
    first, _ = explorer_for(make_cfg("explorer-a"), buffer)
    second, _ = explorer_for(make_cfg("explorer-b"), buffer)
    await asyncio.gather(first.run(), second.run())
    by_producer = Counter(e.producer for e in buffer.written["experience_buffer"])
    assert by_producer == {"explorer-a": 8, "explorer-b": 8}  # each: 2 steps x 2 groups x 2 rollouts
