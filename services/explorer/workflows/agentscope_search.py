"""`agentscope_v1_react_search_workflow`: Trinity-RFT's web-search ReAct agent, judged by an auxiliary model.

The agent (`Friday`, at most `max_turns` reasoning steps) searches the web through an MCP server
that `npx` starts: `search_client_type` `searxng` (mcp-searxng, with SEARXNG_URL naming a SearXNG
instance) or `tavily` (tavily-mcp, with TAVILY_API_KEY). Its structured answer (`{"result": ...}`)
is judged against the truth by the first of `explorer.auxiliary_models` with Trinity's judge
prompt: reward 1 when a line of the judge's reply has `Correctness` and later `YES`, else 0. Every
model call of the run becomes an experience with that reward, except those longer than
`max_model_tokens`. Metrics: `react_turns` (memory messages // 2) and `max_turns`.

`workflow_args` (Trinity's names and defaults): `max_turns` (10), `search_client_type`
(`searxng`), `max_model_tokens` (24000). As in Trinity, an agent or judge error is logged and the
run gets reward 0. Unlike Trinity, a run without an auxiliary model is refused at construction
(Trinity scores every run 0 then).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
from typing import Any

from pydantic import BaseModel, Field

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.workflows.agentscope_support import (
    AgentScopeV1Workflow,
    agentscope_chat_model,
    final_answer_text,
    memory_length,
    quiet,
    require_question,
    stamp,
    user_message,
)
from services.explorer.workflows.base import Task

log = get_logger("explorer.workflows.agentscope_search")

SEARCH_SYSTEM_PROMPT = (
    "You are a Web Information Seeking Master. Your task is to thoroughly seek the internet for "
    "information and provide accurate answers to questions."
)
JUDGE_SYSTEM_PROMPT = "You evaluate correctness."
JUDGE_PROMPT = """Judge whether the following [response] to [question] is correct or not based on the [correct_answer] below.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Your judgement must be in the format and criteria specified below:

1. **Reasoning**: Explain why the [response] is correct or incorrect based on [correct_answer], focusing only on if there are meaningful differences between [correct_answer] and the response. Do not comment on any background to the problem, do not attempt to solve the problem, do not argue for any answer different than [correct_answer], focus only on whether the answers match.

2. **Correctness**: Answer exactly "YES" if [response] matches the [correct_answer] given above, or is within a small margin of error for numerical problems and small format issue for text problems (for example, with or without a hyphen should be considered the same). Answer exactly "NO" otherwise, i.e. if there if there is any inconsistency, ambiguity, non-equivalency, or if the [response] is incorrect.
"""
"""Trinity's judge prompt as it stands (its typos too), so judged rewards compare with Trinity's runs."""
_VERDICT = re.compile(r"Correctness.*?YES", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class SearchServer:
    """An MCP search server started by `npx <args>`, configured by one environment variable."""

    name: str
    args: tuple[str, ...]
    env_var: str


SEARCH_SERVERS = {
    "searxng": SearchServer("searxng_mcp", ("-y", "mcp-searxng"), "SEARXNG_URL"),
    "tavily": SearchServer("tavily_mcp", ("-y", "tavily-mcp@latest"), "TAVILY_API_KEY"),
}


class SearchResult(BaseModel):
    result: str = Field(description="The final result to the initial user query")


def judge_says_correct(judge_reply: str) -> bool:
    """Trinity's verdict rule: `Correctness` then `YES` on one line, any case."""
    return _VERDICT.search(judge_reply) is not None


def judge_messages(question: str | None, response: str, correct_answer: str | None) -> list[dict[str, str]]:
    prompt = JUDGE_PROMPT.format(question=question, response=response, correct_answer=correct_answer)
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": prompt}]


def search_server(workflow_args: dict[str, Any]) -> SearchServer:
    kind = str(workflow_args.get("search_client_type", "searxng"))
    if kind not in SEARCH_SERVERS:
        raise InvalidArgument(
            f"search_client_type must be one of {sorted(SEARCH_SERVERS)}, got {kind!r}",
            field="workflow_args.search_client_type",
        )
    return SEARCH_SERVERS[kind]


class AgentScopeV1ReactSearchWorkflow(AgentScopeV1Workflow):
    """See the module docstring."""

    can_reset = True

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        problems = super().preflight(workflow_args)
        try:
            server = search_server(workflow_args)
        except InvalidArgument as exc:
            return [*problems, exc.message]
        if not os.environ.get(server.env_var):
            problems.append(
                f"{cls.__name__} with search_client_type {server.name.removesuffix('_mcp')!r} needs the "
                f"environment variable {server.env_var} (its MCP search server reads it)"
            )
        if shutil.which("npx") is None:
            problems.append(
                f"{cls.__name__} starts its MCP search server with npx, which is not on PATH (install Node.js)"
            )
        return problems

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        if not self.auxiliary_models:
            raise InvalidArgument(
                f"{type(self).__name__} needs a judge: the first of explorer.auxiliary_models judges the answers",
                field="explorer.auxiliary_models",
            )
        self.reset(task)

    def reset(self, task: Task) -> None:
        self.task = task
        args = task.workflow_args
        self.max_turns = int(args.get("max_turns", 10))
        self.server = search_server(args)
        self.max_model_tokens = int(args.get("max_model_tokens", 24000))
        self.task_desc = require_question(task, type(self).__name__)
        self.truth = task.truth
        self.agent: Any = None

    def build_agent(self) -> Any:
        from agentscope.agent import ReActAgent
        from agentscope.formatter import OpenAIChatFormatter
        from agentscope.memory import InMemoryMemory

        return quiet(
            ReActAgent(
                name="Friday",
                sys_prompt=SEARCH_SYSTEM_PROMPT,
                model=agentscope_chat_model(self.client, self.sampling()),
                formatter=OpenAIChatFormatter(),
                memory=InMemoryMemory(),
                max_iters=self.max_turns,
            )
        )

    async def search(self) -> Any:
        """The agent's reply to the question, with the MCP search server's tools; None when it failed."""
        from agentscope.mcp import StdIOStatefulClient

        env = {self.server.env_var: os.environ.get(self.server.env_var, "")}
        client = StdIOStatefulClient(
            name=self.server.name, command="npx", args=list(self.server.args), env=env
        )
        try:
            await client.connect()
            await self.agent.toolkit.register_mcp_client(client)
            return await self.agent.reply(user_message(self.task_desc), structured_model=SearchResult)
        except Exception as exc:  # noqa: BLE001 - Trinity's rule: a failed search is a wrong answer
            log.warning("search_agent_failed", task_id=self.task.task_id, error=repr(exc))
            return None
        finally:
            if client.is_connected:
                await client.close()

    def judge(self, reply: Any) -> bool:
        """Ask the judge (a sync OpenAI client) whether the reply's answer matches the truth."""
        if reply is None:
            return False
        judge = self.auxiliary_models[0]
        completion = judge.chat.completions.create(
            model=judge.model_path,
            messages=judge_messages(self.task_desc, final_answer_text(reply), self.truth),
            stream=False,
        )
        return judge_says_correct(completion.choices[0].message.content or "")

    async def run_async(self) -> list[Experience]:
        self.model.extract_experience_from_history()  # calls of an earlier failed attempt are not this run's
        self.agent = self.build_agent()
        reply = await self.search()
        try:
            correct = await asyncio.to_thread(self.judge, reply)
        except Exception as exc:  # noqa: BLE001 - as Trinity: a judge failure scores the run 0
            log.warning("search_judge_failed", task_id=self.task.task_id, error=repr(exc))
            correct = False
        exps = self.model.extract_experience_from_history()
        metrics = {
            "react_turns": float(memory_length(self.agent) // 2),
            "max_turns": float(self.max_turns),
        }
        stamp(exps, 1.0 if correct else 0.0, metrics)
        return [exp for exp in exps if len(exp.tokens) <= self.max_model_tokens]
