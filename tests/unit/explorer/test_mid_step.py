"""Partial rollouts in the explorer (services/explorer/mid_step.py): the step's load window, the
versions an experience records, the test hook's setting."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.common.experience import Experience
from services.explorer.mid_step import MidStepWatch, StepLoads, hold_token, partial_rows, token_spans


def test_token_spans_give_each_version_and_its_first_token() -> None:
    assert token_spans(np.array([2, 2, 2, 5, 5, 7])) == ([2, 5, 7], [0, 3, 5])
    assert token_spans(np.array([4, 4])) == ([4], [0])
    assert token_spans(np.array([], dtype=np.int64)) == ([], [])


def test_partial_rows_list_only_the_experiences_of_several_versions() -> None:
    def exp(run_id: int, versions: list[int], starts: list[int]) -> Experience:
        return Experience(
            tokens=np.arange(7),
            prompt_length=2,
            model_version=versions[0],
            task_id="t1",
            run_id=run_id,
            batch_id=3,
            producer="explorer",
            info={"model_versions": versions, "version_starts": starts},
        )

    rows = partial_rows([exp(0, [1], [0]), exp(1, [1, 2], [0, 3]), Experience(np.arange(3), 1, 0)])
    assert rows == [
        {
            "row": "explorer:3/t1/1",
            "model_version": 1,
            "model_versions": [1, 2],
            "version_starts": [0, 3],
            "response_length": 5,
        }
    ]


async def test_a_watch_still_waiting_when_the_step_ends_is_cancelled_and_loads_nothing() -> None:
    waiting, loads = asyncio.Event(), []

    async def next_version() -> int:
        waiting.set()
        await asyncio.Event().wait()  # nothing is published
        return 0

    async def load(version: int) -> int:
        loads.append(version)
        return version

    watch = MidStepWatch(4, next_version, load, loads.append)
    await waiting.wait()
    assert await watch.close() == [] and loads == []


async def test_a_fetch_under_way_when_the_step_ends_is_finished_not_cancelled() -> None:
    # the receiver reported the version as held before the engines got it: dropping it would leave
    # the synchronizer counting weights the engines never loaded
    fetching, release, told = asyncio.Event(), asyncio.Event(), []

    async def next_version() -> int:
        return 6

    async def load(version: int) -> int:
        fetching.set()
        await release.wait()
        return version

    watch = MidStepWatch(4, next_version, load, told.append)
    await fetching.wait()
    closing = asyncio.ensure_future(watch.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # waits for the load rather than cancelling it
    release.set()
    assert await closing == [6] and told == [6]


async def test_a_failed_mid_step_load_fails_the_step() -> None:
    async def next_version() -> int:
        return 2

    async def load(version: int) -> int:
        raise RuntimeError("checkpoint files vanished")

    watch = MidStepWatch(1, next_version, load, lambda v: None)
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="vanished"):
        await watch.close()


async def test_the_null_window_loads_nothing() -> None:
    assert await StepLoads().close() == []


def test_the_hold_hook_takes_a_token_index_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRINITY_TEST_HOLD_TOKEN", raising=False)
    assert hold_token() is None
    monkeypatch.setenv("TRINITY_TEST_HOLD_TOKEN", "3")
    assert hold_token() == 3
    monkeypatch.setenv("TRINITY_TEST_HOLD_TOKEN", "0")
    with pytest.raises(ValueError, match="TRINITY_TEST_HOLD_TOKEN"):
        hold_token()


async def test_a_failed_wait_loads_nothing_and_leaves_the_step_to_the_boundary_check() -> None:
    async def next_version() -> int:
        raise ConnectionError("synchronizer unreachable")

    async def load(version: int) -> int:
        raise AssertionError("nothing to load")

    watch = MidStepWatch(3, next_version, load, lambda v: None)
    await asyncio.sleep(0)
    assert await watch.close() == []
