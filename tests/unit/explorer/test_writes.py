"""Streaming writes (services/explorer/writes.py): each group is written as soon as it is complete,
under keys per (explorer, step, round, group), so a replayed step writes nothing twice."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.common.config.schema import TrinityConfig
from services.common.experience import Experience
from services.explorer.build import build_pool, build_runner
from services.explorer.explorer import Explorer
from services.explorer.pipeline.operators import EXPERIENCE_OPERATORS, ExperienceOperator
from services.explorer.runner import VersionRef
from services.explorer.workflows import WORKFLOWS, Workflow
from services.explorer.workflows.base import WorkflowExperience
from services.models.loading import load_tokenizer
from tests.fakes.explorer import FakeBuffer, FakeWeightSync, RecordingMonitor

GATES: dict[str, asyncio.Event] = {}  # task id -> the event its rollouts wait for (tests set them)


class GatedWorkflow(Workflow):
    """Rewards from the task's `rewards`; a task whose id is in GATES waits for its event first.
    The run draws a random token, so a rerun's rollouts differ from the first run's (sampling)."""

    can_repeat = True
    is_async = True

    async def run_async(self) -> list[Experience]:
        gate = GATES.get(self.task.task_id)
        if gate is not None:
            await gate.wait()
        rng = np.random.default_rng()
        return [
            WorkflowExperience(
                tokens=np.array([1, 2, 3, int(rng.integers(4, 10_000))]),
                prompt_length=2,
                reward=reward,
                metrics={"accuracy": reward},
            )
            for reward in self.task.raw_task["rewards"][: self.task.repeat_times]
        ]


class WholeBatchCount(ExperienceOperator):
    """A batch-level operator (not group_local): records how many groups each call saw."""

    calls: list[int] = []

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        WholeBatchCount.calls.append(len({e.group_id for e in exps}))
        return exps, {}


WORKFLOWS.register_module("gated_workflow", GatedWorkflow, force=True)
EXPERIENCE_OPERATORS.register_module("whole_batch_count", WholeBatchCount, force=True)


def make_cfg(operators: list[dict] | None = None) -> TrinityConfig:
    return TrinityConfig.model_validate(
        {
            "algorithm": {"repeat_times": 2},
            "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 16, "max_response_tokens": 4},
            "buffer": {
                "batch_size": 3,
                "explorer_input": {"taskset": {"name": "tasks", "default_workflow_type": "gated_workflow"}},
            },
            "data_processor": {"experience_pipeline": {"operators": operators or []}},
            "explorer": {"runner_per_model": 3, "eval_on_startup": False},
            "monitor": {"monitor_type": "none"},
        }
    )


@pytest.fixture
def explorer_for():
    built = []

    def make(cfg: TrinityConfig, buffer: FakeBuffer) -> Explorer:
        buffer.cfg = buffer.cfg or cfg
        tok = load_tokenizer(cfg.model.model_path)
        pool = build_pool(cfg, tok)
        runner = build_runner(cfg, pool, tok, VersionRef(), [])
        built.append((pool, runner))
        return Explorer(
            cfg, buffer=buffer, weights=FakeWeightSync(pool), runner=runner, monitor=RecordingMonitor()
        )

    yield make
    GATES.clear()
    for pool, runner in built:
        runner.close()
        pool.close()


def taskset(n: int) -> FakeBuffer:
    return FakeBuffer({"tasks": [{"rewards": [1.0, 0.0]} for _ in range(n)]})


async def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_each_group_is_written_as_soon_as_it_is_complete(explorer_for):
    buffer = taskset(3)
    explorer = explorer_for(make_cfg([{"name": "group_advantage"}]), buffer)
    GATES["1"] = asyncio.Event()  # task 1 of the step hangs until the test lets it go
    run = asyncio.ensure_future(explorer.run())
    await wait_for(lambda: len(buffer.written.get("experience_buffer", [])) == 4)
    written = buffer.written["experience_buffer"]
    assert sorted({e.task_id for e in written}) == ["0", "2"] and not run.done()  # the step goes on
    assert all(e.advantages is not None for e in written)  # the pipeline ran on the group
    assert sorted(buffer.keys) == [
        "explorer:tasks:step1:round0:group0:part0",
        "explorer:tasks:step1:round0:group2:part0",
    ]
    GATES["1"].set()
    await asyncio.wait_for(run, 10)
    assert sorted(e.task_id for e in buffer.written["experience_buffer"]) == ["0", "0", "1", "1", "2", "2"]
    assert explorer.written == 6


async def test_a_replayed_step_writes_only_the_groups_its_killed_predecessor_did_not(explorer_for):
    """The predecessor wrote groups 0 and 2 of step 1, then was killed while task 1 still ran."""
    buffer = taskset(3)
    first = explorer_for(make_cfg(), buffer)
    GATES["1"] = asyncio.Event()
    killed = asyncio.ensure_future(first.run())
    await wait_for(lambda: len(buffer.written.get("experience_buffer", [])) == 4)
    killed.cancel()
    before = list(buffer.written["experience_buffer"])
    GATES.clear()
    successor = explorer_for(make_cfg(), buffer)  # repeat_last: it is handed step 1's batch again
    await successor.run()
    written = buffer.written["experience_buffer"]
    assert successor.replayed_step == 1 and successor.written == 2  # only task 1's group is new
    assert written[:4] == before and sorted(e.task_id for e in written[4:]) == ["1", "1"]
    # the rerun sampled other rollouts for groups 0 and 2: refused, the predecessor's stand
    assert sorted(e.task_id for e in written) == ["0", "0", "1", "1", "2", "2"]
    # a retried write of the same rows under the same key adds nothing
    assert (
        await buffer.write(
            "experience_buffer",
            written[4:],
            idempotency_key=next(iter(k for k in buffer.keys if "group1" in k)),
        )
        == 0
    )


async def test_a_batch_level_operator_sees_the_whole_batch_and_groups_are_written_after_it(explorer_for):
    WholeBatchCount.calls = []
    buffer = taskset(3)
    explorer = explorer_for(make_cfg([{"name": "whole_batch_count"}]), buffer)
    assert explorer.pipeline.batch_level == ["whole_batch_count"]
    await explorer.run()
    assert WholeBatchCount.calls == [3]  # one call with the step's three groups
    assert sorted(buffer.keys) == [f"explorer:tasks:step1:round0:group{g}:part0" for g in range(3)]
    assert len(buffer.written["experience_buffer"]) == 6
