"""Workflow runners: run tasks concurrently with a timeout and bounded retries, never stalling a step.

`runner_per_model * engine_num` slots each hold a ModelWrapper (bound to one engine) and a cached
resettable workflow. A unit of work is one task (repeatable workflows sample repeat_times at
once) or one repeat of it (other workflows). A unit that raises, returns invalid experiences, or
runs past `max_timeout` is retried up to `max_retry_times`, then skipped with the reason logged.
Sync workflows run in daemon threads: a hung one cannot be killed, so it is abandoned together
with its slot's ModelWrapper (a fresh one takes its place) and can never block the process exit.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.workflows.base import Task, Workflow

log = get_logger("explorer.runner")


@dataclass
class UnitResult:
    """Outcome of one task (or one repeat of it) after retries."""

    task: Task
    run_index: int | None  # None: all repeats in one run
    experiences: list[Experience] = field(default_factory=list)
    attempts: int = 0
    timeouts: int = 0
    errors: list[str] = field(default_factory=list)
    failure: BaseException | None = None
    """The last attempt's exception, traceback attached (None: it timed out); `trinity debug` prints it."""
    seconds: float = 0.0
    skipped: bool = False

    @property
    def retries(self) -> int:
        return max(self.attempts - 1, 0)


def run_in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run fn() on a new daemon thread; the returned future resolves on the running loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            setter, value = future.set_exception, exc
        else:
            setter, value = future.set_result, result
        try:
            loop.call_soon_threadsafe(deliver, setter, value)
        except RuntimeError:  # the loop closed while an abandoned workflow was still running
            pass

    threading.Thread(target=target, name="workflow", daemon=True).start()
    return future


def normalize_experience(exp: Any, version: int) -> Experience:
    """Arrays as numpy (Trinity workflows may hand back lists or torch tensors), stamp the version, validate."""
    for name in (
        "tokens",
        "logprobs",
        "action_mask",
        "token_level_rewards",
        "advantages",
        "returns",
        "chosen",
        "rejected",
        "teacher_logprobs",
    ):
        value = getattr(exp, name, None)
        if value is None or isinstance(value, np.ndarray):
            continue
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        value = np.asarray(value)
        if name in ("tokens", "chosen", "rejected"):
            value = value.astype(np.int64)
        elif name == "action_mask":
            value = value.astype(bool)
        else:
            value = value.astype(np.float32)
        setattr(exp, name, value)
    if exp.logprobs is not None and exp.logprobs.dtype != np.float32:
        exp.logprobs = exp.logprobs.astype(np.float32)
    exp.model_version = version
    exp.validate()
    return exp


class VersionRef:
    """The model version the explorer holds, shared by the explorer, the runner and the wrappers."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


class _Slot:
    def __init__(self, index: int, wrapper: Any) -> None:
        self.index = index
        self.wrapper = wrapper
        self.workflow: Workflow | None = None


class WorkflowRunner:
    """Runs tasks on a pool of slots; see the module docstring."""

    def __init__(
        self,
        wrapper_factory: Callable[[int], Any],
        *,
        slots: int,
        max_timeout: float,
        max_retry_times: int,
        version_fn: VersionRef,
        auxiliary_models: list[Any] | None = None,
        max_repeat_times_per_runner: int | None = None,
    ) -> None:
        self._factory = wrapper_factory
        self.max_repeat_times_per_runner = max_repeat_times_per_runner
        self._slots: asyncio.Queue[_Slot] = asyncio.Queue()
        self._all = [_Slot(i, wrapper_factory(i)) for i in range(slots)]
        for slot in self._all:
            self._slots.put_nowait(slot)
        self.max_timeout = max_timeout
        self.max_retry_times = max_retry_times
        self.version_fn = version_fn
        self.auxiliary_models = auxiliary_models or []

    @property
    def slots(self) -> int:
        """Units that can run at once (explorer.runner_per_model per engine)."""
        return len(self._all)

    @property
    def wrappers(self) -> list[Any]:
        return [slot.wrapper for slot in self._all]

    async def run_tasks(
        self,
        tasks: list[Task],
        on_task: Callable[[int, list[UnitResult]], Awaitable[None]] | None = None,
    ) -> list[UnitResult]:
        """Every task's units, concurrently; results in task order (repeats in order).

        A workflow that samples all repeats in one run gets them in chunks of at most
        max_repeat_times_per_runner (Trinity's key), each chunk on its own runner; run ids continue
        across a task's chunks (0..repeat_times-1), so the group is the same as unsplit.
        `on_task(i, results)` is awaited as soon as task i's units are all done (its whole group),
        while the other tasks go on: the explorer writes each group then (streaming writes).
        """

        async def one_task(index: int, task: Task) -> list[UnitResult]:
            units: list[tuple[Task, int | None, int]] = []  # (task, run index, run-id offset of a chunk)
            if getattr(task.workflow, "can_repeat", False):
                units.extend((chunk, None, offset) for chunk, offset in self._chunks(task))
            else:
                units.extend((task, i, 0) for i in range(task.repeat_times))
            results = list(await asyncio.gather(*(self.run_unit(t, i) for t, i, _ in units)))
            for result, (_task, _index, offset) in zip(results, units, strict=True):
                for exp in result.experiences:
                    exp.run_id += offset
            if on_task is not None:
                await on_task(index, results)
            return results

        per_task = await asyncio.gather(*(one_task(i, task) for i, task in enumerate(tasks)))
        return [result for results in per_task for result in results]

    def _chunks(self, task: Task) -> list[tuple[Task, int]]:
        most = self.max_repeat_times_per_runner
        if most is None or task.repeat_times <= most:
            return [(task, 0)]
        return [
            (task.copy_with(repeat_times=min(most, task.repeat_times - start)), start)
            for start in range(0, task.repeat_times, most)
        ]

    async def run_unit(self, task: Task, run_index: int | None) -> UnitResult:
        result = UnitResult(task=task, run_index=run_index)
        started = time.perf_counter()
        slot = await self._slots.get()
        try:
            for attempt in range(self.max_retry_times + 1):
                result.attempts = attempt + 1
                try:
                    version = self.version_fn()  # the oldest the attempt can sample with
                    exps = await asyncio.wait_for(self._attempt(slot, task, run_index), self.max_timeout)
                    result.experiences = self._stamp(exps, task, run_index, version)
                    break
                except asyncio.TimeoutError:
                    result.timeouts += 1
                    result.errors.append(f"timed out after {self.max_timeout}s")
                    result.failure = None
                    self._replace(slot)
                except Exception as exc:  # noqa: BLE001 - a workflow's failure is data, not a crash
                    result.errors.append(f"{type(exc).__name__}: {exc}")
                    result.failure = exc
                    log.debug("workflow_traceback", task_id=task.task_id, traceback=traceback.format_exc())
                    slot.workflow = None
                log.warning(
                    "workflow_failed",
                    task_id=task.task_id,
                    taskset=task.taskset,
                    attempt=attempt + 1,
                    of=self.max_retry_times + 1,
                    reason=result.errors[-1],
                )
            else:
                result.skipped = True
                log.error(
                    "workflow_skipped",
                    task_id=task.task_id,
                    taskset=task.taskset,
                    attempts=result.attempts,
                    reasons=result.errors,
                )
        finally:
            result.seconds = time.perf_counter() - started
            self._slots.put_nowait(slot)
        return result

    def _replace(self, slot: _Slot) -> None:
        """A timed-out workflow may still be running (sync, in its thread): give the slot fresh objects."""
        old = slot.wrapper
        slot.wrapper, slot.workflow = self._factory(slot.index), None
        try:
            old.close()
        except Exception:  # noqa: BLE001
            log.exception("wrapper_close_failed")

    def _workflow_for(self, slot: _Slot, task: Task) -> Workflow:
        cached = slot.workflow
        if cached is not None and type(cached) is task.workflow and cached.resettable():
            cached.reset(task)
            return cached
        workflow = task.to_workflow(slot.wrapper, self.auxiliary_models)
        slot.workflow = workflow
        return workflow

    async def _attempt(self, slot: _Slot, task: Task, run_index: int | None) -> list[Any]:
        task = task.copy_with()
        task.rollout_args.n = task.repeat_times if run_index is None else 1
        cls = task.workflow
        if getattr(cls, "is_async", False):
            exps = await self._workflow_for(slot, task).run_async()
        else:
            exps = await run_in_daemon_thread(lambda: self._workflow_for(slot, task).run())
        if not isinstance(exps, list):
            raise TypeError(
                f"{cls.__name__}.run() must return a list of Experience, got {type(exps).__name__}"
            )
        return exps

    def _stamp(self, exps: list[Any], task: Task, run_index: int | None, version: int) -> list[Experience]:
        """Ids, eval flag and model version: the oldest of the versions the experience records
        (`info["model_versions"]`, ModelWrapper), else the one held when the attempt began (weights
        may load during a step, mid_step.py; the older bound keeps the staleness accounting safe)."""
        out = []
        # one run, several experiences (one per model call) that left `step` unset: number them
        number_steps = run_index is not None and all(getattr(e, "step", 0) == 0 for e in exps)
        for i, exp in enumerate(exps):
            recorded = (getattr(exp, "info", None) or {}).get("model_versions")
            exp = normalize_experience(exp, int(min(recorded)) if recorded else version)
            # a workflow may file some experiences under a task of their own (trainable RULER's
            # judgements: "<task>-ruler"), so they form their own GRPO group as in Trinity
            exp.task_id = task.task_id + str(exp.info.pop("task_id_suffix", ""))
            exp.run_id = run_index if run_index is not None else i
            if number_steps:
                exp.step = i
            exp.is_eval = task.is_eval
            exp.info.setdefault("taskset", task.taskset)
            out.append(exp)
        return out

    def close(self) -> None:
        for slot in self._all:
            slot.wrapper.close()
