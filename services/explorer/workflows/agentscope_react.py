r"""AgentScope ReAct agents as workflows (Trinity-RFT's examples), scored on their final answer.

Each run gives the task to an agentscope ReAct agent whose model is the policy, served through
its OpenAI-compatible endpoint; every model call of the run is recorded in the model's history
(`explorer.rollout_model.enable_history: true`) and becomes one experience carrying the run's
reward. The agent is asked for a structured reply, `{"result": ...}`, through agentscope's
`generate_response` tool.

| name | agent | reward |
| --- | --- | --- |
| `agentscope_react_workflow`, `as_react_workflow` | `react_agent`, agentscope's meta tool, no other tool | the template's (`workflow_args.type`, default `gsm8k`) |
| `agentscope_react_math_workflow` | `math_react_agent` with agentscope's `execute_python_code` | `math_boxed_reward` of the answer against the truth |
| `agentscopev0_react_math_workflow` | agentscope 0.x `ReActAgentV2`, Python tool, 5 iterations | as above |
| `agentscope_v1_react_search_workflow` | see services/explorer/workflows/agentscope_search.py | an LLM judge |

The truth is the response_key column, read by rewards/answers.py's truth_answer (a GSM8K solution,
`... #### 72`, counts as its last part). The `gsm8k` template's reward is `math_boxed_reward`
without the think check: `accuracy` (1 when the boxed answer states the truth's) + `format_score`
(0); its reward_fn_args may set `format_score_coef` (unused without the think check, accepted as
in Trinity). `task.reward_fn` is
not used. Metrics: `react_memory_length` (messages in the agent's memory) and the reward's parts.

`execute_python_code` runs the model's code in a subprocess on the explorer's machine, as in
Trinity. agentscope 1.x runs the first three rows (AGENTSCOPE_V1_INSTALL); agentscopev0 needs
agentscope 0.x (AGENTSCOPE_V0_INSTALL), so the two cannot share an environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.rewards.math import MathBoxedReward
from services.explorer.workflows.agentscope_support import (
    AGENTSCOPE_V0_INSTALL,
    AgentScopeV1Workflow,
    agentscope_chat_model,
    agentscope_version_problems,
    content_text,
    final_answer_text,
    memory_length,
    quiet,
    refuse_unless_ready,
    require_history,
    require_question,
    stamp,
    user_message,
)
from services.explorer.workflows.base import Task, Workflow

GSM8K_SYSTEM_PROMPT = (
    "You are an agent specialized in solving math problems with tools. Please solve the math problem "
    "given to you. You can write and execute Python code to perform calculation or verify your answer. "
    "You should return your final answer within \\boxed{{}}."
)
"""Trinity's text, doubled braces included (it is never formatted there either)."""
MATH_REACT_SYSTEM_PROMPT = f"\n{GSM8K_SYSTEM_PROMPT}\n"


class MathResult(BaseModel):
    """The structured reply the math agents are asked for."""

    result: str = Field(
        description="Your solution of the given math problem. Put your final answer in boxed format, e.g., \\boxed{42}"
    )


def math_answer_parts(answer: str, truth: str | None) -> dict[str, float]:
    """`math_boxed_reward` (no think check) of the agent's answer against the truth's answer."""
    return MathBoxedReward()(answer, truth)


def gsm8k_reward(
    response: dict[str, Any] | None, truth: str | None, format_score_coef: float = 0.1
) -> dict[str, float]:
    """The `gsm8k` template's reward over the structured reply (None when the agent never gave one)."""
    answer = str((response or {}).get("result", ""))
    return MathBoxedReward(format_score_coef=format_score_coef)(answer, truth)


@dataclasses.dataclass(frozen=True)
class ReactTemplate:
    """A task type of agentscope_react_workflow: the agent's prompt, its reply's shape and the reward."""

    system_prompt: str
    response_structure: type[BaseModel]
    reward: Callable[..., dict[str, float]]
    reward_args: tuple[str, ...] = ()


TEMPLATES: dict[str, ReactTemplate] = {
    "gsm8k": ReactTemplate(GSM8K_SYSTEM_PROMPT, MathResult, gsm8k_reward, ("format_score_coef",)),
}
UNPORTED_TEMPLATES = {
    "email_search": "it needs Trinity's email_searcher environment (an indexed e-mail SQLite database and "
    "an LLM judge), which is not part of this project",
}


class AgentScopeReActWorkflow(AgentScopeV1Workflow):
    """`agentscope_react_workflow` / `as_react_workflow`: a ReAct agent per task, rewarded by its template."""

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        problems = super().preflight(workflow_args)
        try:
            cls.template(workflow_args)
        except InvalidArgument as exc:
            problems.append(exc.message)
        return problems

    @staticmethod
    def template(workflow_args: dict[str, Any]) -> ReactTemplate:
        kind = str(workflow_args.get("type", "gsm8k"))
        if kind in TEMPLATES:
            return TEMPLATES[kind]
        why = UNPORTED_TEMPLATES.get(kind, "no such template")
        raise InvalidArgument(
            f"workflow_args.type {kind!r} of agentscope_react_workflow: {why}; available: {sorted(TEMPLATES)}",
            field="workflow_args.type",
        )

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.spec = self.template(task.workflow_args)
        unknown = sorted(set(task.reward_fn_args) - set(self.spec.reward_args))
        if unknown:
            raise InvalidArgument(
                f"reward_fn_args {unknown} are not arguments of the template's reward; "
                f"allowed: {list(self.spec.reward_args)}",
                field="reward_fn_args",
            )
        self.query = require_question(task, type(self).__name__)
        self.answer = task.truth
        self.agent = self.build_agent()

    def build_agent(self) -> Any:
        from agentscope.agent import ReActAgent
        from agentscope.formatter import OpenAIChatFormatter

        return quiet(
            ReActAgent(
                name="react_agent",
                sys_prompt=self.spec.system_prompt,
                model=agentscope_chat_model(self.client, self.sampling()),
                formatter=OpenAIChatFormatter(),
                enable_meta_tool=True,  # the agent may equip tool groups itself (Trinity's setting)
            )
        )

    async def reply(self) -> dict[str, Any] | None:
        """The agent's structured reply (None when it never produced one)."""
        msg = await self.agent.reply(user_message(self.query), structured_model=self.spec.response_structure)
        metadata = getattr(msg, "metadata", None)
        return metadata if isinstance(metadata, dict) else None

    async def run_async(self) -> list[Experience]:
        self.model.extract_experience_from_history()  # calls of an earlier failed attempt are not this run's
        response = await self.reply()
        parts = self.spec.reward(response, self.answer, **self.task.reward_fn_args)
        exps = self.model.extract_experience_from_history()
        return stamp(
            exps, float(sum(parts.values())), {"react_memory_length": memory_length(self.agent), **parts}
        )


class _MathAgentTask:
    """What both math ReAct workflows keep per task: the question, the truth and a fresh agent."""

    can_reset = True

    def reset(self, task: Task) -> None:
        self.task = task
        self.task_desc = require_question(task, type(self).__name__)
        self.truth = task.truth
        self.agent = self.build_agent()

    def build_agent(self) -> Any:
        raise NotImplementedError


class AgentScopeReactMathWorkflow(_MathAgentTask, AgentScopeV1Workflow):
    """`agentscope_react_math_workflow`: a math ReAct agent with a Python tool; resettable."""

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    def build_agent(self) -> Any:
        from agentscope.agent import ReActAgent
        from agentscope.formatter import OpenAIChatFormatter
        from agentscope.memory import InMemoryMemory
        from agentscope.tool import Toolkit, execute_python_code

        toolkit = Toolkit()
        toolkit.register_tool_function(execute_python_code)
        return quiet(
            ReActAgent(
                name="math_react_agent",
                sys_prompt=MATH_REACT_SYSTEM_PROMPT,
                model=agentscope_chat_model(self.client, self.sampling()),
                formatter=OpenAIChatFormatter(),
                toolkit=toolkit,
                memory=InMemoryMemory(),
            )
        )

    async def run_async(self) -> list[Experience]:
        self.model.extract_experience_from_history()
        reply = await self.agent.reply(user_message(self.task_desc), structured_model=MathResult)
        parts = math_answer_parts(final_answer_text(reply), self.truth)
        exps = self.model.extract_experience_from_history()
        return stamp(
            exps, float(sum(parts.values())), {"react_memory_length": memory_length(self.agent), **parts}
        )


class AgentScopeV0ReactMathWorkflow(_MathAgentTask, Workflow):
    """`agentscopev0_react_math_workflow`: the math agent on agentscope 0.x's ReActAgentV2 (sync)."""

    requires = (("agentscope", AGENTSCOPE_V0_INSTALL),)
    model_config_name = "my_model"

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        return super().preflight(workflow_args) + agentscope_version_problems(
            cls.__name__, 0, AGENTSCOPE_V0_INSTALL
        )

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        refuse_unless_ready(type(self), task.workflow_args)
        require_history(model, type(self).__name__)
        self.client = model.get_openai_client()
        self.toolkit = self.configure()
        self.reset(task)

    def configure(self) -> Any:
        """agentscope 0.x set-up: the policy as model config `my_model`; the Python tool."""
        import agentscope
        from agentscope.service import ServiceToolkit, execute_python_code

        agentscope.init(
            model_configs=[
                {
                    "model_type": "openai_chat",
                    "config_name": self.model_config_name,
                    "model_name": self.client.model_path,
                    "api_key": "EMPTY",
                    "generate_args": {
                        "temperature": self.task.rollout_args.get("temperature", 1.0),
                        "max_tokens": self.task.rollout_args.get("max_tokens") or 4096,
                    },
                    "use_openai_formatter": True,
                }
            ],
            disable_saving=True,
        )
        toolkit = ServiceToolkit()
        toolkit.add(execute_python_code, timeout=300, use_docker=False, maximum_memory_bytes=None)
        return toolkit

    def build_agent(self) -> Any:
        from agentscope.agents import ReActAgentV2

        agent = ReActAgentV2(
            name="math_react_agent",
            sys_prompt=MATH_REACT_SYSTEM_PROMPT,
            model_config_name=self.model_config_name,
            service_toolkit=self.toolkit,
            max_iters=5,
            verbose=False,
        )
        agent.model.client = self.client  # the policy's endpoint instead of api.openai.com
        return agent

    def run(self) -> list[Experience]:
        self.model.extract_experience_from_history()
        reply = self.agent.reply(user_message(self.task_desc))
        parts = math_answer_parts(content_text(getattr(reply, "content", None)), self.truth)
        exps = self.model.extract_experience_from_history()
        length = len(self.agent.memory.get_memory())
        return stamp(exps, float(sum(parts.values())), {"react_memory_length": length, **parts})


__all__ = [
    "AgentScopeReActWorkflow",
    "AgentScopeReactMathWorkflow",
    "AgentScopeV0ReactMathWorkflow",
]
