"""AgentScope workflows without agentscope: preflight and construction checks, answer extraction and
rewards derived by hand from math_boxed_reward's rule (accuracy 1 when the last box states the
truth, math_equiv.py; format 0 without the think check). tests/agentscope runs the same workflows
with real agentscope agents (`make test-agentscope`).
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from services.common.errors import FailedPrecondition, InvalidArgument
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.rewards.answers import truth_answer
from services.explorer.workflows import WORKFLOWS
from services.explorer.workflows import agentscope as adapters
from services.explorer.workflows import agentscope_react as react
from services.explorer.workflows import agentscope_search as search
from services.explorer.workflows.agentscope_support import (
    AGENTSCOPE_V0_INSTALL,
    final_answer_text,
)
from tests.unit.explorer.workflows.agentscope.conftest import V1, installed, task_for

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


# --- answers and rewards -----------------------------------------------------------------------


def test_reference_answer_and_final_answer_text() -> None:
    assert truth_answer("48/2 = 24 clips.\n#### 72") == "72"  # the truth the react rewards score against
    assert truth_answer("0.5") == "0.5"
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
