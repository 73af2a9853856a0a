"""AgentScope workflows' history-to-experience path with stand-in agents (no agentscope) that call the
real tiny model over the explorer's OpenAI API: adapters, ReAct, math and search workflows.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace
from typing import Any

import openai
import pytest

from services.common.errors import InvalidArgument
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.workflows import Task
from services.explorer.workflows import agentscope as adapters
from services.explorer.workflows import agentscope_react as react
from services.explorer.workflows import agentscope_search as search
from services.explorer.workflows.agentscope_support import resolve_function
from tests.unit.explorer.workflows.agentscope.conftest import task_for

# --- runs with stand-in agents on the real model ----------------------------------------------

REPLIES: list[str] = []


async def two_call_agent(task: dict[str, Any], client: Any, *aux: Any) -> Any:
    """A plain async agent (no agentscope): two chat calls through the OpenAI client."""
    for question in (task["question"], task["question"] + "0"):
        reply = await client.chat.completions.create(
            model=client.model_path, messages=[{"role": "user", "content": question}], max_tokens=4
        )
        REPLIES.append(reply.choices[0].message.content)
    return task["output"]


class PlainAdapter(adapters.AgentScopeWorkflowAdapter):
    """The adapter with the OpenAI client itself as its chat model (no agentscope needed)."""

    requires = ()

    def make_chat_model(self, client: Any) -> Any:
        return client


class PlainAdapterV1(adapters.AgentScopeWorkflowAdapterV1):
    requires = ()

    def make_chat_model(self, client: Any) -> Any:
        return client

    def make_auxiliary_chat_models(self) -> dict[str, Any]:
        return {}


async def test_adapter_turns_each_call_into_an_experience(wrapper: ModelWrapper, no_agentscope: None) -> None:
    wrapper.chat([{"role": "user", "content": "9+9="}])  # a stray call before the run: not this run's
    REPLIES.clear()
    task = Task(
        workflow=PlainAdapter,
        raw_task={"question": "7+5=", "output": 0.25},
        workflow_args={"workflow_func": f"{__name__}:two_call_agent"},
    )
    exps = await task.to_workflow(wrapper).run_async()
    assert [e.prompt_text for e in exps] == ["7+5=", "7+5=0"]  # the builtin template joins the contents
    assert [e.response_text for e in exps] == REPLIES
    assert [(e.reward, e.step, e.metrics) for e in exps] == [(0.25, 0, {}), (0.25, 1, {})]
    for exp in exps:
        assert exp.logprobs is not None and len(exp.logprobs) == exp.response_length <= 4
    assert wrapper.extract_experience_from_history() == []


class Output(SimpleNamespace):
    """Shaped like agentscope.tuner's WorkflowOutput / JudgeOutput (attributes reward, response, metrics)."""


async def judge_by_length(task: dict[str, Any], response: Any, aux: dict[str, Any]) -> Output:
    return Output(reward=0.5 * len(response), metrics={"judged": 1.0})


async def test_adapter_v1_outputs_judge_and_metrics(wrapper: ModelWrapper, no_agentscope: None) -> None:
    def run(output: Any, judge: str | None = None) -> Any:
        args = {"workflow_func": f"{__name__}:two_call_agent", "judge_func": judge}
        task = Task(
            workflow=PlainAdapterV1, raw_task={"question": "3+4=", "output": output}, workflow_args=args
        )
        return task.to_workflow(wrapper).run_async()

    exps = await run(Output(reward=1.0, response=None, metrics={"turns": 2}))
    assert (
        [e.reward for e in exps] == [1.0, 1.0] and exps[0].metrics == {} and exps[1].metrics == {"turns": 2.0}
    )
    exps = await run(
        {"response": ["a", "b", "c"], "metrics": {"turns": 2}}, judge=f"{__name__}:judge_by_length"
    )
    assert [e.reward for e in exps] == [1.5, 1.5] and exps[1].metrics == {"turns": 2.0, "judged": 1.0}
    with pytest.raises(InvalidArgument, match="no reward; the workflow_func output must set reward"):
        await run({"metrics": {}})
    with pytest.raises(InvalidArgument, match="has no response for judge_func"):
        await run({"reward": 1.0}, judge=f"{__name__}:judge_by_length")


def test_adapter_v1_auxiliary_models_by_model_path(
    monkeypatch: pytest.MonkeyPatch, wrapper: ModelWrapper, no_agentscope: None
) -> None:
    class AuxAdapter(adapters.AgentScopeWorkflowAdapterV1):
        requires = ()

        def make_chat_model(self, client: Any) -> Any:
            return client

    monkeypatch.setattr(adapters, "agentscope_chat_model", lambda client, kwargs: client)
    judge = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="EMPTY")
    judge.model_path = "judge-7b"  # type: ignore[attr-defined]
    plain = openai.OpenAI(base_url="http://127.0.0.1:8/v1", api_key="EMPTY")
    task = Task(workflow=AuxAdapter, workflow_args={"workflow_func": two_call_agent})
    models = task.to_workflow(wrapper, [judge, plain]).make_auxiliary_chat_models()
    assert list(models) == ["judge-7b", "auxiliary_model_1"]
    assert all(isinstance(m, openai.AsyncOpenAI) for m in models.values())
    assert (
        str(models["judge-7b"].base_url) == "http://127.0.0.1:9/v1/"
        and models["judge-7b"].model_path == "judge-7b"
    )


class StandInAgent:
    """An agent that makes two calls through the policy's client and replies with a canned message."""

    def __init__(self, client: Any, reply: Any, memory: int, sync: bool = False) -> None:
        self.client, self.canned, self.sync = client, reply, sync
        self.memory = SimpleNamespace(content=list(range(memory)), get_memory=lambda: list(range(memory)))
        self.asked: list[Any] = []

    def _messages(self, msg: Any) -> list[list[dict[str, str]]]:
        return [[{"role": "user", "content": msg}], [{"role": "user", "content": msg + "!"}]]

    async def reply(self, msg: Any, structured_model: Any = None) -> Any:
        self.asked.append((msg, structured_model))
        for messages in self._messages(msg):
            await self.client.chat.completions.create(model="tiny", messages=messages, max_tokens=3)
        return self.canned

    def reply_sync(self, msg: Any) -> Any:
        self.asked.append((msg, None))
        for messages in self._messages(msg):
            self.client.chat.completions.create(model="tiny", messages=messages, max_tokens=3)
        return self.canned


def stand_in(cls: type, reply: Any, memory: int) -> type:
    """`cls` with the stand-in agent and no package requirement."""

    def build_agent(self: Any) -> StandInAgent:
        return StandInAgent(self.client, reply, memory)

    return type(f"StandIn{cls.__name__}", (cls,), {"requires": (), "build_agent": build_agent})


@pytest.fixture
def plain_messages(monkeypatch: pytest.MonkeyPatch, no_agentscope: None) -> None:
    monkeypatch.setattr(react, "user_message", lambda text: text)


async def test_react_workflow_scores_the_structured_reply(
    wrapper: ModelWrapper, plain_messages: None
) -> None:
    workflow_cls = stand_in(
        react.AgentScopeReActWorkflow, SimpleNamespace(metadata={"result": "\\boxed{42}"}), 5
    )
    task = task_for(
        "as_react_workflow", {"question": "6*7=", "answer": "6 sevens.\n#### 42"}, workflow=workflow_cls
    )
    workflow = task.to_workflow(wrapper)
    exps = await workflow.run_async()
    assert workflow.agent.asked == [("6*7=", react.MathResult)]
    assert [e.prompt_text for e in exps] == ["6*7=", "6*7=!"]
    expected = {"react_memory_length": 5.0, "accuracy": 1.0, "format_score": 0.0}
    assert [(e.reward, e.step, e.metrics) for e in exps] == [(1.0, 0, expected), (1.0, 1, expected)]

    no_reply = stand_in(react.AgentScopeReActWorkflow, SimpleNamespace(metadata=None), 2)
    exps = (
        await task_for("as_react_workflow", {"question": "6*7=", "answer": "42"}, workflow=no_reply)
        .to_workflow(wrapper)
        .run_async()
    )
    assert [e.reward for e in exps] == [0.0, 0.0] and exps[0].metrics["accuracy"] == 0.0
    with pytest.raises(InvalidArgument, match=r"reward_fn_args \['bogus'\] are not arguments"):
        task_for(
            "as_react_workflow", {"question": "q"}, workflow=workflow_cls, reward_fn_args={"bogus": 1}
        ).to_workflow(wrapper)
    with pytest.raises(InvalidArgument, match="has no 'question' column"):
        task_for("as_react_workflow", {"prompt": "q"}, workflow=workflow_cls).to_workflow(wrapper)


async def test_react_math_workflow_reads_the_reply_text_and_resets(
    wrapper: ModelWrapper, plain_messages: None
) -> None:
    content = [{"type": "text", "text": "So it is \\boxed{1/2}"}]
    workflow_cls = stand_in(
        react.AgentScopeReactMathWorkflow, SimpleNamespace(metadata=None, content=content), 3
    )
    workflow = task_for("x", {"question": "1/4+1/4=", "answer": "0.5"}, workflow=workflow_cls).to_workflow(
        wrapper
    )
    first_agent = workflow.agent
    exps = await workflow.run_async()
    assert first_agent.asked == [("1/4+1/4=", react.MathResult)]
    assert [e.reward for e in exps] == [1.0, 1.0]
    assert exps[1].metrics == {"react_memory_length": 3.0, "accuracy": 1.0, "format_score": 0.0}
    assert workflow.resettable()
    workflow.reset(task_for("x", {"question": "2+2=", "answer": "5"}, workflow=workflow_cls))
    assert workflow.agent is not first_agent and workflow.task_desc == "2+2="
    assert [e.reward for e in await workflow.run_async()] == [0.0, 0.0]  # 1/2 is not 5


def test_v0_react_math_workflow_runs_sync(wrapper: ModelWrapper, plain_messages: None) -> None:
    class StandInV0(react.AgentScopeV0ReactMathWorkflow):
        requires = ()

        def configure(self) -> Any:
            return None

        def build_agent(self) -> Any:
            agent = StandInAgent(self.client, SimpleNamespace(content=[{"text": "\\boxed{3}"}]), 4)
            agent.reply = agent.reply_sync  # agentscope 0.x replies synchronously
            return agent

    task = task_for("x", {"question": "1+2=", "answer": "#### 3"}, workflow=StandInV0)
    exps = task.to_workflow(wrapper).run()
    assert [e.prompt_text for e in exps] == ["1+2=", "1+2=!"]
    assert [e.reward for e in exps] == [1.0, 1.0] and exps[0].metrics["react_memory_length"] == 4.0


class FakeJudge:
    """A judge client (sync, like explorer.auxiliary_models) with a canned verdict."""

    model_path = "judge"

    def __init__(self, verdict: str | Exception) -> None:
        self.verdict, self.requests = verdict, []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **request: Any) -> Any:
        self.requests.append(request)
        if isinstance(self.verdict, Exception):
            raise self.verdict
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.verdict))])


class StandInSearch(search.AgentScopeV1ReactSearchWorkflow):
    """The search run with the MCP server and agentscope replaced: two calls, prompts of 4 and 24 characters."""

    requires = ()
    reply: Any = SimpleNamespace(metadata={"result": "Paris"})

    def build_agent(self) -> Any:
        return SimpleNamespace(memory=SimpleNamespace(content=[0, 1, 2]))

    async def search(self) -> Any:
        for question in (self.task_desc, self.task_desc * 6):
            await self.client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": question}], max_tokens=2
            )
        return self.reply


async def test_search_workflow_judges_the_answer(
    monkeypatch: pytest.MonkeyPatch, wrapper: ModelWrapper, no_agentscope: None
) -> None:
    monkeypatch.setenv("SEARXNG_URL", "http://127.0.0.1:1")
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/npx")
    args = {"max_turns": 4, "max_model_tokens": 20}
    task = task_for("x", {"question": "Who?", "answer": "Paris"}, workflow=StandInSearch, workflow_args=args)
    with pytest.raises(InvalidArgument, match="needs a judge"):
        task.to_workflow(wrapper)
    judge = FakeJudge("2. **Correctness**: YES")
    exps = await task.to_workflow(wrapper, [judge]).run_async()
    # the 24-character prompt's call is longer than max_model_tokens 20: dropped
    assert [e.prompt_text for e in exps] == ["Who?"]
    assert exps[0].reward == 1.0 and exps[0].metrics == {"react_turns": 1.0, "max_turns": 4.0}
    [request] = judge.requests
    assert request["model"] == "judge" and request["messages"] == search.judge_messages(
        "Who?", "Paris", "Paris"
    )
    for verdict in ("Correctness: NO", RuntimeError("judge down")):
        exps = await task.to_workflow(wrapper, [FakeJudge(verdict)]).run_async()
        assert [e.reward for e in exps] == [0.0]
    monkeypatch.setattr(StandInSearch, "reply", None)  # the agent failed: no judge call, reward 0
    silent = FakeJudge("Correctness: YES")
    assert [e.reward for e in await task.to_workflow(wrapper, [silent]).run_async()] == [0.0]
    assert silent.requests == []


def test_agent_functions_resolve_from_dotted_paths() -> None:
    here = __name__
    assert resolve_function(f"{here}:two_call_agent", "workflow_func", "W") is two_call_agent
    assert resolve_function(two_call_agent, "workflow_func", "W") is two_call_agent
    with pytest.raises(
        InvalidArgument, match="W: cannot import workflow_args.judge_func 'nowhere.mod:judge'"
    ):
        resolve_function("nowhere.mod:judge", "judge_func", "W")
    with pytest.raises(
        InvalidArgument, match=r"'services.explorer.workflows.agentscope_react:GSM8K_SYSTEM_PROMPT' is a str"
    ):
        resolve_function(
            "services.explorer.workflows.agentscope_react:GSM8K_SYSTEM_PROMPT", "workflow_func", "W"
        )
