"""What the AgentScope workflows share: package checks, the agentscope chat model, replies, experiences.

agentscope is imported inside the functions that need it, so this module (and the workflows'
prompts, reward rules and checks) loads without it. agentscope 1.x is the API the workflows are
written against: agentscope 2 renamed the agent classes, and agentscope 1.0.21 imports an mcp
client module that mcp 2 removed, hence the pins of AGENTSCOPE_V1_INSTALL.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.experience import Experience
from services.common.registry import import_object
from services.explorer.workflows.base import Task, Workflow

AGENTSCOPE_V1_INSTALL = "pip install 'agentscope>=1.0.7,<2' 'mcp<2'"
AGENTSCOPE_V0_INSTALL = "pip install 'agentscope>=0.1.4,<1'"


# --- checks --------------------------------------------------------------------------------------


def agentscope_version_problems(workflow: str, major: int, install: str) -> list[str]:
    """A problem when the installed agentscope is not `major`.x (none when absent: `requires` says so)."""
    try:
        version = importlib.metadata.version("agentscope")
    except importlib.metadata.PackageNotFoundError:
        return []
    head = version.split(".")[0]
    if head.isdigit() and int(head) == major:
        return []
    return [
        f"{workflow} is written against agentscope {major}.x, but agentscope {version} is installed ({install})"
    ]


def refuse_unless_ready(cls: type[Workflow], workflow_args: dict[str, Any]) -> None:
    """Raise FailedPrecondition with preflight's sentences, so construction fails as `config check` does."""
    problems = cls.preflight(workflow_args)
    if problems:
        raise FailedPrecondition("; ".join(problems), field="workflow_args")


def require_history(model: Any, workflow: str) -> None:
    if not getattr(model, "enable_history", False):
        raise InvalidArgument(
            f"{workflow} makes one experience per model call of the agent, read from the model's "
            "history; set explorer.rollout_model.enable_history: true",
            field="explorer.rollout_model.enable_history",
        )


def require_question(task: Task, workflow: str) -> str:
    """The task's question (the prompt_key column); a row without it is refused."""
    question = task.task_desc
    if question is None:
        raise InvalidArgument(
            f"{workflow}: task {task.task_id!r} has no {task.format_args.prompt_key!r} column (format.prompt_key)",
            field="format.prompt_key",
        )
    return question


class AgentScopeV1Workflow(Workflow):
    """Base of the agentscope 1.x workflows: package and history checked at construction; async runs.

    `self.client` is the policy's openai.AsyncOpenAI (with `model_path`, as Trinity's).
    """

    is_async = True
    requires = (("agentscope", AGENTSCOPE_V1_INSTALL),)

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        problems = super().preflight(workflow_args)
        return problems + agentscope_version_problems(cls.__name__, 1, AGENTSCOPE_V1_INSTALL)

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        refuse_unless_ready(type(self), task.workflow_args)
        require_history(model, type(self).__name__)
        self.client = model.get_openai_async_client()

    def sampling(self) -> dict[str, Any]:
        """Trinity's generate_kwargs of the ReAct agents (the model caps max_tokens anyway)."""
        return {
            "temperature": self.task.rollout_args.get("temperature", 1.0),
            "max_tokens": self.task.rollout_args.get("max_tokens") or 4096,
        }


# --- agentscope objects --------------------------------------------------------------------------


def agentscope_chat_model(client: Any, generate_kwargs: dict[str, Any]) -> Any:
    """agentscope's OpenAIChatModel calling through `client` (an openai.AsyncOpenAI with `model_path`).

    The same as Trinity's TrinityChatModel, which agentscope 1.0.21 deprecates in favour of this.
    """
    from agentscope.model import OpenAIChatModel

    model = OpenAIChatModel(
        model_name=client.model_path, api_key="EMPTY", stream=False, generate_kwargs=generate_kwargs
    )
    model.client = client
    return model


def async_twin(client: Any) -> Any:
    """An openai.AsyncOpenAI for the endpoint of `client` (auxiliary models arrive as sync clients)."""
    import openai

    if isinstance(client, openai.AsyncOpenAI):
        return client
    twin = openai.AsyncOpenAI(base_url=str(client.base_url), api_key=client.api_key)
    twin.model_path = getattr(client, "model_path", "")  # type: ignore[attr-defined]  # Trinity's attribute
    return twin


def user_message(text: str | None) -> Any:
    """The task as the user's agentscope Msg (the same constructor in agentscope 0.x and 1.x)."""
    from agentscope.message import Msg

    return Msg("user", text, role="user")


def quiet(agent: Any) -> Any:
    """The agent with its console printing off (the explorer's log is not a chat transcript)."""
    if hasattr(agent, "set_console_output_enabled"):
        agent.set_console_output_enabled(False)
    return agent


def memory_length(agent: Any) -> int:
    """Messages in an agentscope agent's memory (InMemoryMemory keeps them in `content`)."""
    return len(getattr(agent.memory, "content", ()) or ())


# --- user functions and their outputs -----------------------------------------------------------


def resolve_function(spec: Any, key: str, workflow: str) -> Callable[..., Any]:
    """workflow_args[key] as a callable: the object itself, or imported from its dotted path."""
    field = f"workflow_args.{key}"
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec:
        raise InvalidArgument(
            f"{workflow} needs {field}: the agent's async function, as a dotted path (my_pkg.agents:solve)",
            field=field,
        )
    try:
        obj = import_object(spec)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"{workflow}: cannot import {field} {spec!r}: {exc}", field=field) from exc
    if not callable(obj):
        raise InvalidArgument(
            f"{workflow}: {field} {spec!r} is a {type(obj).__name__}, not a function", field=field
        )
    return obj


async def call(func: Callable[..., Any], *args: Any) -> Any:
    """`func(*args)`, awaited when it returns an awaitable (agent functions are async)."""
    result = func(*args)
    return await result if inspect.isawaitable(result) else result


def output_field(output: Any, name: str) -> Any:
    """`name` of a tuner output (a pydantic WorkflowOutput / JudgeOutput, or a mapping with those keys)."""
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)


# --- replies and experiences --------------------------------------------------------------------


def content_text(content: Any) -> str:
    """Text of a message's content: a string, or the text blocks of a block list joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", "")) for block in content if isinstance(block, dict) and "text" in block
        )
    return str(content)


def final_answer_text(reply: Any) -> str:
    """The answer in an agent's reply: the structured `result`, else the reply's text ("" for no reply)."""
    if reply is None:
        return ""
    metadata = getattr(reply, "metadata", None)
    if isinstance(metadata, dict) and "result" in metadata:
        return str(metadata["result"])
    content = getattr(reply, "content", reply)
    if isinstance(content, dict) and "result" in content:
        return str(content["result"])
    return content_text(content)


def stamp(exps: list[Experience], reward: float, metrics: dict[str, float]) -> list[Experience]:
    """Every model call of the run gets the run's reward and metrics; steps number the calls."""
    for step, exp in enumerate(exps):
        exp.reward = reward
        exp.step = step
        exp.metrics.update(metrics)
    return exps
