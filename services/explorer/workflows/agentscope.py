"""AgentScope agents as workflows: Trinity-RFT's `agentscope_workflow_adapter` and `_v1`.

The agent is the user's async function, named by `workflow_args.workflow_func` (a dotted path such
as `my_pkg.agents:solve`, or the function itself when the config is built in Python). It gets the
task row and an agentscope chat model bound to the policy's OpenAI-compatible endpoint
(`model.get_openai_async_client()`). Every model call the agent makes is recorded in the model's
history (`explorer.rollout_model.enable_history: true`) and becomes one experience; all of a run's
experiences carry the run's reward.

- `agentscope_workflow_adapter`: `reward = await workflow_func(task, model)`.
- `agentscope_workflow_adapter_v1`: `out = await workflow_func(task, model, auxiliary_models)`,
  an agentscope.tuner WorkflowOutput (`reward`, `response`, `metrics`). With
  `workflow_args.judge_func`, `await judge_func(task, out.response, auxiliary_models)` (a
  JudgeOutput: `reward`, `metrics`) gives the reward. `auxiliary_models` maps the model path of each
  `explorer.auxiliary_models` entry to an agentscope chat model. Metrics go on the last experience.

Both need agentscope 1.x (agentscope_support.AGENTSCOPE_V1_INSTALL). The chat model is agentscope's
OpenAIChatModel with the policy's client swapped in, as Trinity's TrinityChatModel does. An output
may also be a plain mapping with the same keys; the agent function may be sync.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.agentscope_support import (
    AgentScopeV1Workflow,
    agentscope_chat_model,
    async_twin,
    call,
    output_field,
    resolve_function,
)
from services.explorer.workflows.base import Task


def rollout_generate_kwargs(task: Task) -> dict[str, Any]:
    """Trinity's sampling arguments of the adapters' chat model (max_tokens is capped by the model anyway)."""
    args = task.rollout_args
    return {
        "temperature": args.get("temperature", 1.0),
        "top_p": args.get("top_p", 1.0),
        "max_tokens": args.get("max_tokens") or 4096,
        "logprobs": True,
        "top_logprobs": args.get("logprobs", 0),
    }


class AgentScopeWorkflowAdapter(AgentScopeV1Workflow):
    """`reward = await workflow_func(task_row, chat_model)`; every recorded model call gets the reward."""

    function_keys: tuple[str, ...] = ("workflow_func",)

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        problems = super().preflight(workflow_args)
        for key in cls.function_keys:
            if key == "workflow_func" or workflow_args.get(key) is not None:
                try:
                    resolve_function(workflow_args.get(key), key, cls.__name__)
                except InvalidArgument as exc:
                    problems.append(exc.message)
        return problems

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        name = type(self).__name__
        self.workflow_func = resolve_function(task.workflow_args.get("workflow_func"), "workflow_func", name)
        self.chat_model = self.make_chat_model(self.client)

    def make_chat_model(self, client: Any) -> Any:
        return agentscope_chat_model(client, rollout_generate_kwargs(self.task))

    def experiences(self, reward: float, metrics: dict[str, float] | None = None) -> list[Experience]:
        """The model calls recorded since the run began, each with `reward`; `metrics` on the last one."""
        exps = self.model.extract_experience_from_history()
        for step, exp in enumerate(exps):
            exp.reward = float(reward)
            exp.step = step
        if exps and metrics:
            exps[-1].metrics.update({k: float(v) for k, v in metrics.items()})
        return exps

    async def run_async(self) -> list[Experience]:
        # calls left by an earlier failed attempt on this model are not part of this run
        self.model.extract_experience_from_history()
        reward = await call(self.workflow_func, self.task.raw_task, self.chat_model)
        return self.experiences(float(reward))


class AgentScopeWorkflowAdapterV1(AgentScopeWorkflowAdapter):
    """`workflow_func(task_row, chat_model, auxiliary_models)` -> WorkflowOutput; `judge_func` may score it."""

    function_keys = ("workflow_func", "judge_func")

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        judge = task.workflow_args.get("judge_func")
        self.judge_func = (
            None if judge is None else resolve_function(judge, "judge_func", type(self).__name__)
        )
        self.auxiliary_chat_models: dict[str, Any] | None = None

    def make_auxiliary_chat_models(self) -> dict[str, Any]:
        """Model path (else `auxiliary_model_<i>`) -> an agentscope chat model of that auxiliary model."""
        return {
            getattr(client, "model_path", None) or f"auxiliary_model_{i}": agentscope_chat_model(
                async_twin(client), {}
            )
            for i, client in enumerate(self.auxiliary_models)
        }

    async def run_async(self) -> list[Experience]:
        self.model.extract_experience_from_history()
        if self.auxiliary_chat_models is None:
            self.auxiliary_chat_models = self.make_auxiliary_chat_models()
        name = type(self).__name__
        output = await call(
            self.workflow_func, self.task.raw_task, self.chat_model, self.auxiliary_chat_models
        )
        metrics = dict(output_field(output, "metrics") or {})
        if self.judge_func is not None:
            response = output_field(output, "response")
            if response is None:
                raise InvalidArgument(
                    f"{name}: the workflow_func output has no response for judge_func to judge",
                    field="workflow_args.workflow_func",
                )
            judged = await call(self.judge_func, self.task.raw_task, response, self.auxiliary_chat_models)
            reward = output_field(judged, "reward")
            metrics.update(output_field(judged, "metrics") or {})
        else:
            reward = output_field(output, "reward")
        if reward is None:
            raise InvalidArgument(
                f"{name}: no reward; the workflow_func output must set reward, or give workflow_args.judge_func",
                field="workflow_args.workflow_func",
            )
        return self.experiences(float(reward), metrics)
