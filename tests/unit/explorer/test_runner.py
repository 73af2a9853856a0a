"""Runner: retries, timeouts and skips never stall a step; repeats, resets and stamping."""

from __future__ import annotations

import asyncio
import time
import traceback

import numpy as np
import torch

from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import Experience, Task, Workflow


class Wrapper:
    def __init__(self, i):
        self.index = i
        self.closed = False

    def close(self):
        self.closed = True


def exp(n_response=2, **kw):
    return Experience(
        tokens=[1, 2] + [3] * n_response, prompt_length=2, reward=1.0, logprobs=[-0.5] * n_response, **kw
    )


class Flaky(Workflow):
    attempts: dict[str, int] = {}

    def run(self):
        key = self.task.task_id
        Flaky.attempts[key] = Flaky.attempts.get(key, 0) + 1
        behavior = self.task.raw_task["behavior"]
        if behavior == "raise" or (behavior == "once" and Flaky.attempts[key] == 1):
            raise ValueError(f"boom {key}")
        if behavior == "hang":
            time.sleep(30)
        if behavior == "bad":
            return [Experience(tokens=np.array([1, 2, 3]), prompt_length=1, logprobs=np.zeros(5, np.float32))]
        return [exp()]


class AsyncHang(Workflow):
    is_async = True

    async def run_async(self):
        await asyncio.sleep(30)


class Repeatable(Workflow):
    can_repeat = True
    can_reset = True
    created = 0

    def __init__(self, **kw):
        super().__init__(**kw)
        Repeatable.created += 1
        self.resets = 0

    def reset(self, task):
        self.task = task
        self.resets += 1

    def run(self):
        # Trinity workflows may return torch tensors and omit model_version
        return [
            Experience(
                tokens=torch.tensor([5, 6, 7]), prompt_length=1, reward=float(i), logprobs=torch.zeros(2)
            )
            for i in range(self.task.rollout_args.n)
        ]


def make_runner(slots=4, timeout=0.5, retries=1, version=3):
    made = []

    def factory(i):
        made.append(Wrapper(i))
        return made[-1]

    return WorkflowRunner(
        factory, slots=slots, max_timeout=timeout, max_retry_times=retries, version_fn=VersionRef(version)
    ), made


def task(workflow, behavior="ok", task_id="t", repeat=1):
    return Task(
        workflow=workflow, raw_task={"behavior": behavior}, task_id=task_id, repeat_times=repeat, taskset="ts"
    )


async def test_failures_are_retried_then_skipped_and_the_batch_completes():
    Flaky.attempts.clear()
    runner, made = make_runner()
    tasks = [task(Flaky, b, b) for b in ("ok", "raise", "once", "hang", "bad")] + [
        task(AsyncHang, "x", "async-hang")
    ]
    # hung workflows are abandoned after max_timeout x attempts, so the batch returns (they sleep 30 s)
    results = {r.task.task_id: r for r in await asyncio.wait_for(runner.run_tasks(tasks), 25)}
    assert results["ok"].experiences and results["ok"].attempts == 1 and not results["ok"].skipped
    assert results["once"].experiences and results["once"].retries == 1 and not results["once"].skipped
    for key in ("raise", "hang", "bad", "async-hang"):
        assert results[key].skipped and results[key].attempts == 2 and not results[key].experiences
    assert results["raise"].errors == ["ValueError: boom raise"] * 2
    # the last exception is kept with its traceback (trinity debug prints it); a timeout has none
    failure = results["raise"].failure
    assert isinstance(failure, ValueError) and str(failure) == "boom raise"
    assert "run" in [frame.name for frame in traceback.extract_tb(failure.__traceback__)]  # Flaky.run
    assert results["hang"].failure is None and results["ok"].failure is None
    assert results["hang"].timeouts == 2 and results["async-hang"].timeouts == 2
    assert "does not match the response length" in results["bad"].errors[0]
    assert len(made) == 4 + 4  # each timeout replaced its slot's wrapper
    assert sum(w.closed for w in made) == 4


async def test_repeats_resets_and_stamping():
    Repeatable.created = 0
    runner, _ = make_runner(slots=1)
    results = await runner.run_tasks(
        [task(Repeatable, task_id="a", repeat=3), task(Repeatable, task_id="b", repeat=3)]
    )
    assert (
        Repeatable.created == 1 and runner._all[0].workflow.resets == 1
    )  # one instance, reset for the 2nd task
    for result in results:
        assert [e.run_id for e in result.experiences] == [0, 1, 2]  # one run with n = repeat_times
        for e in result.experiences:
            assert e.model_version == 3 and e.task_id == result.task.task_id
            assert e.tokens.dtype == np.int64 and e.logprobs.dtype == np.float32
    Flaky.attempts.clear()
    results = await runner.run_tasks([task(Flaky, task_id="c", repeat=3)])
    assert [r.run_index for r in results] == [0, 1, 2]  # not repeatable: one run per repeat
    assert [r.experiences[0].run_id for r in results] == [0, 1, 2]


class JudgedTwice(Workflow):
    """An answer and a judgement filed under the task's own "-ruler" task (trainable RULER's way)."""

    def run(self):
        judgement = exp(info={"task_id_suffix": "-ruler"})
        return [exp(), judgement]


async def test_task_id_suffix_files_an_experience_under_its_own_task():
    runner = WorkflowRunner(Wrapper, slots=1, max_timeout=10, max_retry_times=0, version_fn=VersionRef(1))
    (result,) = await runner.run_tasks([Task(workflow=JudgedTwice, task_id="t7")])
    runner.close()
    assert [e.task_id for e in result.experiences] == ["t7", "t7-ruler"]
    assert all("task_id_suffix" not in e.info for e in result.experiences)
    # two calls of one run, no step numbers given: numbered 0, 1 by the runner
    assert [e.step for e in result.experiences] == [0, 1]


class LoadsMidRun(Workflow):
    """Weights change while it runs (a mid-step load, services/explorer/mid_step.py); its first
    experience records the versions that sampled it, as ModelWrapper does, the second none."""

    is_async = True

    async def run_async(self):
        self.task.raw_task["ref"].value = 5
        return [exp(info={"model_versions": [4, 5], "version_starts": [0, 1]}), exp()]


async def test_the_stamp_is_the_oldest_recorded_version_else_the_one_held_when_the_run_began():
    runner, _ = make_runner(version=4)
    [result] = await runner.run_tasks(
        [Task(workflow=LoadsMidRun, raw_task={"ref": runner.version_fn}, task_id="t", taskset="ts")]
    )
    recorded, unrecorded = result.experiences
    assert runner.version_fn() == 5
    assert recorded.model_version == 4 and recorded.info["model_versions"] == [4, 5]
    assert unrecorded.model_version == 4  # not 5: the run may have sampled with 4 too
