"""AgentScope workflows without agentscope: checks, prompts, answer extraction and rewards, and the
history-to-experience path with stand-in agents that call the real tiny model over the OpenAI API.

agentscope itself is not a dependency; tests/agentscope runs the same workflows with real agentscope
agents where it is installed. Rewards are derived by hand from math_boxed_reward's rule (accuracy 1
when the last box states the truth, math_equiv.py; format 0 without the think check).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import openai
import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import FailedPrecondition, InvalidArgument
from services.explorer.engines.base import BatchingEngine
from services.explorer.engines.transformers_engine import TransformersEngine
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows import agentscope as adapters
from services.explorer.workflows import agentscope_react as react
from services.explorer.workflows import agentscope_search as search
from services.explorer.workflows.agentscope_support import (
    AGENTSCOPE_V0_INSTALL,
    AGENTSCOPE_V1_INSTALL,
    final_answer_text,
    resolve_function,
)
from services.models.loading import load_causal_lm, load_tokenizer

V1 = AGENTSCOPE_V1_INSTALL


@pytest.fixture
def wrapper() -> Iterator[ModelWrapper]:
    tok = load_tokenizer("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"),
            eos_token_ids=[tok.eos_token_id],
            pad_token_id=tok.pad_token_id,
        )
    )
    model = ModelWrapper(
        engine, tok, max_prompt_tokens=200, max_response_tokens=8, enable_history=True, model_name="tiny"
    )
    yield model
    model.close()
    engine.close()


@pytest.fixture
def no_agentscope(monkeypatch: pytest.MonkeyPatch) -> None:
    """agentscope absent, whatever this environment has (stand-in agents need no version check either)."""
    real_spec, real_version = importlib.util.find_spec, importlib.metadata.version

    def version(name: str) -> str:
        if name == "agentscope":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "agentscope" else real_spec(name, *a)
    )
    monkeypatch.setattr(importlib.metadata, "version", version)


def installed(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """Pretend agentscope `version` is installed (only the checks look; nothing imports it)."""
    real_spec, real_version = importlib.util.find_spec, importlib.metadata.version
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "agentscope" else real_spec(name, *a),
    )
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: version if name == "agentscope" else real_version(name)
    )


def task_for(name: str, raw: dict[str, Any], **changes: Any) -> Task:
    workflow = changes.pop("workflow", None) or WORKFLOWS.get(name)
    task = Task(
        workflow=workflow,
        raw_task=raw,
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        task_id="t1",
    )
    for key, value in changes.items():
        setattr(task, key, value)
    return task


# --- checks ------------------------------------------------------------------------------------


def test_preflight_names_the_missing_package_and_the_agent_function(no_agentscope: None) -> None:
    missing = "needs the Python package 'agentscope', which is not installed"
    assert adapters.AgentScopeWorkflowAdapter.preflight({}) == [
        f"AgentScopeWorkflowAdapter {missing} ({V1})",
        "AgentScopeWorkflowAdapter needs workflow_args.workflow_func: the agent's async function, as a "
        "dotted path (my_pkg.agents:solve)",
    ]
    assert react.AgentScopeReActWorkflow.preflight({}) == [f"AgentScopeReActWorkflow {missing} ({V1})"]
    assert react.AgentScopeV0ReactMathWorkflow.preflight({}) == [
        f"AgentScopeV0ReactMathWorkflow {missing} (pip install 'agentscope>=0.1.4,<1')"
    ]
    assert V1 == "pip install 'agentscope>=1.0.7,<2' 'mcp<2'"
    for name in ("agentscope_react_math_workflow", "as_react_workflow", "agentscope_workflow_adapter_v1"):
        assert any("'agentscope'" in p for p in WORKFLOWS.get(name).preflight({"workflow_func": len}))


def test_preflight_names_a_wrong_agentscope_version(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, "2.0.11")
    assert react.AgentScopeReactMathWorkflow.preflight({}) == [
        f"AgentScopeReactMathWorkflow is written against agentscope 1.x, but agentscope 2.0.11 is installed ({V1})"
    ]
    assert react.AgentScopeV0ReactMathWorkflow.preflight({}) == [
        "AgentScopeV0ReactMathWorkflow is written against agentscope 0.x, but agentscope 2.0.11 is installed "
        f"({AGENTSCOPE_V0_INSTALL})"
    ]
    installed(monkeypatch, "1.0.21")
    assert react.AgentScopeReactMathWorkflow.preflight({}) == []
    assert react.AgentScopeReActWorkflow.preflight({"type": "email_search"}) == [
        "workflow_args.type 'email_search' of agentscope_react_workflow: it needs Trinity's email_searcher "
        "environment (an indexed e-mail SQLite database and an LLM judge), which is not part of this project; "
        "available: ['gsm8k']"
    ]
    assert (
        "type 'math' of agentscope_react_workflow: no such template;"
        in react.AgentScopeReActWorkflow.preflight({"type": "math"})[0]
    )


def test_search_preflight_needs_its_server_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, "1.0.21")
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    cls = search.AgentScopeV1ReactSearchWorkflow
    assert cls.preflight({"search_client_type": "tavily"}) == [
        "AgentScopeV1ReactSearchWorkflow with search_client_type 'tavily' needs the environment variable "
        "TAVILY_API_KEY (its MCP search server reads it)",
        "AgentScopeV1ReactSearchWorkflow starts its MCP search server with npx, which is not on PATH (install Node.js)",
    ]
    assert cls.preflight({"search_client_type": "bing"}) == [
        "search_client_type must be one of ['searxng', 'tavily'], got 'bing'"
    ]
    monkeypatch.setenv("SEARXNG_URL", "http://127.0.0.1:1")
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/npx")
    assert cls.preflight({}) == []


def test_construction_refuses_what_preflight_reports(no_agentscope: None, wrapper: ModelWrapper) -> None:
    task = task_for("agentscope_react_math_workflow", {"question": "1+1=", "answer": "2"})
    with pytest.raises(FailedPrecondition) as info:
        task.to_workflow(wrapper)
    assert info.value.message == "; ".join(react.AgentScopeReactMathWorkflow.preflight({}))


def test_construction_needs_history(monkeypatch: pytest.MonkeyPatch, wrapper: ModelWrapper) -> None:
    installed(monkeypatch, "1.0.21")
    wrapper.enable_history = False
    with pytest.raises(InvalidArgument) as info:
        task_for("as_react_workflow", {"question": "1+1="}).to_workflow(wrapper)
    assert info.value.field == "explorer.rollout_model.enable_history"


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


# --- answers and rewards -----------------------------------------------------------------------


def test_reference_answer_and_final_answer_text() -> None:
    assert react.reference_answer("48/2 = 24 clips.\n#### 72") == "72"
    assert react.reference_answer("0.5") == "0.5"
    assert (
        final_answer_text(SimpleNamespace(metadata={"result": "\\boxed{3}"}, content="ignored"))
        == "\\boxed{3}"
    )
    assert final_answer_text(SimpleNamespace(metadata=None, content={"result": "7"})) == "7"
    blocks = [
        {"type": "text", "text": "so"},
        {"type": "tool_use", "id": "1"},
        {"type": "text", "text": "\\boxed{4}"},
    ]
    assert final_answer_text(SimpleNamespace(metadata=None, content=blocks)) == "so\n\\boxed{4}"
    assert final_answer_text(None) == ""


def test_math_rewards_by_hand() -> None:
    truth = "Half of 1 is a half.\n#### 0.5"
    assert react.math_answer_parts("\\boxed{\\frac{1}{2}}", truth) == {"accuracy": 1.0, "format_score": 0.0}
    assert react.math_answer_parts("0.5", truth) == {"accuracy": 0.0, "format_score": 0.0}  # no box
    assert react.gsm8k_reward({"result": "It is \\boxed{1/2}"}, truth) == {
        "accuracy": 1.0,
        "format_score": 0.0,
    }
    assert react.gsm8k_reward(None, truth) == {"accuracy": 0.0, "format_score": 0.0}  # no structured reply
    assert react.gsm8k_reward({"result": "\\boxed{2}"}, "2", format_score_coef=0.5)["accuracy"] == 1.0
    assert react.GSM8K_SYSTEM_PROMPT.endswith("within \\boxed{{}}.")
    assert react.MATH_REACT_SYSTEM_PROMPT == f"\n{react.GSM8K_SYSTEM_PROMPT}\n"


def test_search_judge_rule_and_prompt() -> None:
    assert search.judge_says_correct("1. **Reasoning**: same.\n2. **Correctness**: YES")
    assert search.judge_says_correct("correctness: yes")
    assert not search.judge_says_correct("**Correctness**: NO\nYES, I am sure")  # YES on another line
    system, user = search.judge_messages("Capital of France?", "Paris", "Paris")
    assert system == {"role": "system", "content": "You evaluate correctness."}
    assert user["role"] == "user" and user["content"].startswith(
        "Judge whether the following [response] to [question] is correct or not based on the [correct_answer] "
        "below.\n\n[question]: Capital of France?\n\n[response]: Paris\n\n[correct_answer]: Paris\n\n"
    )


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
