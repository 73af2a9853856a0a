"""Task and Workflow: the extension point for environment authors (Trinity-RFT's API).

A Trinity workflow ports with import changes only:

    from services.explorer.workflows import WORKFLOWS, Task, Workflow   # was trinity.common.workflows
    from services.common.experience import Experience                   # was trinity.common.experience

`task.format_args.prompt_key`, `task.rollout_args.n`, `task.raw_task`, `task.workflow_args`,
`task.reward_fn` (a class or callable, already resolved from its registered name) and
`task.reward_fn_args` behave as in Trinity. A workflow either implements `run()` (sync, run in a
worker thread) or `run_async()` (run on the explorer's event loop; set `is_async = True`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from services.common.config.buffer import FormatConfig
from services.common.experience import Experience
from services.common.experience import Task as WireTask
from services.explorer.extras import installed

ROLLOUT_DEFAULTS: dict[str, Any] = {"n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 0}


class RolloutArgs(dict):
    """Sampling arguments with attribute access (Trinity's GenerationConfig): `args.n`, `args.temperature`.

    `dict(args)` / `**args` pass them straight to `model.chat(...)`. max_tokens is absent unless
    set, so the model's max_response_tokens applies.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            if name == "max_tokens":
                return None
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def sampling(self) -> dict[str, Any]:
        """The keys the model understands (drops logprobs, which is always on)."""
        return {k: v for k, v in self.items() if k != "logprobs"}


@dataclass
class Task:
    """One task as a workflow sees it (Trinity's trinity.common.workflows.Task)."""

    workflow: type | None = None
    repeat_times: int = 1
    format_args: FormatConfig = field(default_factory=FormatConfig)
    rollout_args: RolloutArgs = field(default_factory=lambda: RolloutArgs(ROLLOUT_DEFAULTS))
    workflow_args: dict[str, Any] = field(default_factory=dict)
    reward_fn: Any = None
    reward_fn_args: dict[str, Any] = field(default_factory=dict)
    raw_task: dict[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    task_id: str = ""
    index: int = 0
    taskset: str = ""
    batch_id: int = 0
    workflow_name: str = ""

    def to_workflow(self, model: Any, auxiliary_models: list[Any] | None = None) -> Workflow:
        assert self.workflow is not None, "task.workflow is not resolved"
        return self.workflow(task=self, model=model, auxiliary_models=auxiliary_models)

    @property
    def task_desc(self) -> str | None:
        """The prompt column (format_args.prompt_key) of the raw task."""
        value = self.raw_task.get(self.format_args.prompt_key)
        return None if value is None else str(value)

    @property
    def truth(self) -> str | None:
        """The reference answer column (format_args.response_key) of the raw task."""
        value = self.raw_task.get(self.format_args.response_key)
        return None if value is None else str(value)

    def copy_with(self, **changes: Any) -> Task:
        clone = copy.copy(self)
        clone.rollout_args = RolloutArgs(self.rollout_args)
        for key, value in changes.items():
            setattr(clone, key, value)
        return clone

    @classmethod
    def from_wire(cls, wire: WireTask, *, workflow: type, reward_fn: Any, batch_id: int = 0) -> Task:
        """Build from the buffer's Task, whose settings the buffer already resolved (config/tasksets.py);
        the taskset's reward_fn_args travel in workflow_args["reward_fn_args"]."""
        workflow_args = dict(wire.workflow_args or {})
        return cls(
            workflow=workflow,
            repeat_times=max(int(wire.repeat_times or 1), 1),
            format_args=FormatConfig.model_validate(wire.format_args or {}),
            rollout_args=RolloutArgs({**ROLLOUT_DEFAULTS, **(wire.rollout_args or {})}),
            workflow_args=workflow_args,
            reward_fn=reward_fn,
            reward_fn_args=dict(workflow_args.get("reward_fn_args") or {}),
            raw_task=dict(wire.raw_task or {}),
            is_eval=wire.is_eval,
            task_id=wire.task_id,
            index=wire.index,
            taskset=wire.taskset,
            batch_id=batch_id,
            workflow_name=wire.workflow,
        )


class Workflow:
    """How a task is run: sample from `model`, score, return experiences.

    Class attributes a subclass may set:
    - `can_repeat`: run() already returns task.rollout_args.n samples, so the runner sets n to
      repeat_times and calls run() once; otherwise the runner calls run() repeat_times times.
    - `can_reset`: reuse one instance across tasks through reset(task) (or override resettable()).
    - `is_async`: the runner awaits run_async() on its event loop instead of run() in a thread.
    - `requires`: (import name, what to install) of packages the workflow cannot run without;
      `trinity config check` and the explorer's start-up report the missing ones (`preflight`).
    """

    can_repeat: bool = False
    can_reset: bool = False
    is_async: bool = False
    requires: tuple[tuple[str, str], ...] = ()

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        """Problems that stop this workflow before its first task (missing packages or data).

        The default checks `requires`; environment workflows extend it (data paths in
        `workflow_args`). Each problem is one sentence naming what is missing and how to get it.
        """
        problems = []
        for module, install in cls.requires:
            if not installed(module):
                problems.append(
                    f"{cls.__name__} needs the Python package {module!r}, which is not installed ({install})"
                )
        return problems

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        self.task = task
        self.model = model
        given = list(auxiliary_models or [])
        # the explorer hands over the auxiliary ModelWrappers: workflows see OpenAI clients in
        # `auxiliary_models` (Trinity's) and the wrappers (chat, logprobs) in `auxiliary_model_wrappers`
        self.auxiliary_model_wrappers = [m for m in given if hasattr(m, "get_openai_client")]
        self.auxiliary_models = [
            m.get_openai_client() if hasattr(m, "get_openai_client") else m for m in given
        ]

    def resettable(self) -> bool:
        return self.can_reset

    def reset(self, task: Task) -> None:
        raise NotImplementedError(f"{type(self).__name__} is not resettable")

    def run(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__} implements neither run() nor run_async()")

    async def run_async(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__} has no run_async(); set is_async = False")


class ResettableWorkflow(Workflow):
    """A workflow set up entirely by `reset(task)`: construction calls it, and the runner reuses one
    instance for the next task of the same workflow (can_reset)."""

    can_reset = True

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)


@dataclass
class WorkflowExperience(Experience):
    """Experience with model_version optional, as Trinity workflows build it (the runner stamps it).

    Exported as `services.explorer.workflows.Experience`. tokens / logprobs may be lists or torch
    tensors; the runner turns them into numpy arrays.
    """

    model_version: int = -1
