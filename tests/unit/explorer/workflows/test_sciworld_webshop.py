"""ScienceWorld and WebShop workflows: preflight, action rules and rewards by hand, one episode each
against a stand-in environment with the real package's interface, on the real ModelWrapper.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.common.errors import InvalidArgument
from services.explorer.workflows import RolloutArgs
from services.explorer.workflows.sciworld import SciWorldWorkflow, episode_reward
from services.explorer.workflows.webshop import (
    BAD_FORMAT,
    EMPTY_SEARCH,
    NO_SEARCH_BAR,
    WebShopWorkflow,
    validate_action,
)
from tests.fakes.env_workflows import (
    decode,
    hide_packages,
    make_task,
    model_text,
    other_text,
    stand_in,
)

# --- ScienceWorld --------------------------------------------------------------------------------------


class FakeScienceWorld:
    """ScienceWorld's Python interface as the workflow uses it (step rewards are score changes, 0-100)."""

    def __init__(self, rewards: list[tuple[float, bool]]) -> None:
        self.rewards = rewards
        self.position = 0
        self.commands: list[str] = []
        self.resets = 0
        self.closed = 0

    def get_gold_action_sequence(self) -> list[str]:
        return ["look around", "teleport to kitchen", "focus on water", "activate stove"]

    def get_task_description(self) -> str:
        return "Your task is to boil water."

    def reset(self) -> tuple[str, dict[str, Any]]:
        self.resets += 1
        self.position = 0
        return "This room is called the hallway.", {}

    def step(self, command: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.commands.append(command)
        reward, done = self.rewards[self.position % len(self.rewards)]
        self.position += 1
        return f"You did: {command}", reward, done, {}

    def close(self) -> None:
        self.closed += 1


def test_sciworld_reward_is_the_best_running_score_over_100() -> None:
    # running totals 10, -10, 40, 40: the best is 40
    assert episode_reward([10, -20, 50, 0]) == pytest.approx(0.4)
    assert episode_reward([-5, -5]) == 0.0  # the best never drops below the start (0)
    assert episode_reward([]) == 0.0


def test_sciworld_preflight_names_the_package_and_java(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_packages(monkeypatch, "scienceworld")
    monkeypatch.setattr("services.explorer.workflows.sciworld.shutil.which", lambda name: None)
    problems = SciWorldWorkflow.preflight({})
    assert len(problems) == 2
    assert "SciWorldWorkflow needs the Python package 'scienceworld'" in problems[0]
    assert "Java runtime" in problems[1] and "`java`" in problems[1]


def test_sciworld_rejects_a_task_that_is_not_a_config(make_model: Any) -> None:
    model, _ = make_model([])
    with pytest.raises(InvalidArgument, match="task_name and var_num"):
        SciWorldWorkflow(
            task=make_task("sciworld_workflow", {"task_desc": "boil"}, prompt_key="task_desc"), model=model
        )


def test_sciworld_plays_n_episodes_on_one_environment(make_model: Any) -> None:
    replies = ["<action>teleport to kitchen</action>", "<action>activate stove</action>"] * 2
    model, _ = make_model(replies)
    env = FakeScienceWorld([(25.0, False), (75.0, True)])
    config = {"task_name": "boil", "var_num": 3, "jar_path": "/opt/sw.jar"}
    task = make_task(
        "sciworld_workflow",
        {"task_desc": json.dumps(config)},
        prompt_key="task_desc",
        rollout_args=RolloutArgs(n=2, temperature=1.0),
    )
    cls = stand_in(SciWorldWorkflow, env)
    exps = cls(task=task, model=model).run()
    assert cls.made == [(config,)] and env.resets == 2 and env.closed == 1
    assert len(exps) == 2
    for exp in exps:
        assert exp.reward == pytest.approx(1.0)  # 25 + 75 = 100 -> 1.0
        assert exp.metrics == {"env_rounds": 1.0, "env_done": 1.0, "golden_rounds": 4.0}
        first = (
            "Observation: \nTask Description: Your task is to boil water.\nThis room is called the hallway."
        )
        assert decode(model, exp.tokens[: exp.prompt_length]).endswith(first)
        assert model_text(model, exp) == replies[0] + "<eos>" + replies[1] + "<eos>"
        assert other_text(model, exp) == "Observation: \nYou did: teleport to kitchen"


# --- WebShop -------------------------------------------------------------------------------------------

PAGE = {"has_search_bar": False, "clickables": ["back to search", "buy now", "red"]}


def test_webshop_action_validation() -> None:
    home = {"has_search_bar": True, "clickables": ["search"]}
    assert validate_action("search[red shoes]", home) == (True, "")
    assert validate_action("search", home) == (False, EMPTY_SEARCH)
    assert validate_action("search[red shoes]", PAGE) == (False, NO_SEARCH_BAR)
    assert validate_action("click[Buy Now]", PAGE) == (True, "")  # button names match lowercased
    ok, message = validate_action("click[Add to cart]", PAGE)
    assert not ok and message.endswith(
        "The buttons you can click now are: ['back to search', 'buy now', 'red']"
    )
    assert validate_action("buy it", PAGE) == (False, BAD_FORMAT)
    assert validate_action("search[]", home) == (False, BAD_FORMAT)  # no argument to match: not an action


def test_webshop_preflight_names_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_packages(monkeypatch, "gym", "web_agent_site")
    problems = WebShopWorkflow.preflight({})
    assert len(problems) == 2
    assert (
        "'gym'" in problems[0]
        and "'web_agent_site'" in problems[1]
        and "princeton-nlp/WebShop" in problems[1]
    )


def test_webshop_preflight_names_missing_product_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "web_agent_site"
    package.mkdir()
    real = importlib.util.find_spec

    def find_spec(name: str, package_name: str | None = None) -> Any:
        if name in ("gym", "web_agent_site"):
            return SimpleNamespace(submodule_search_locations=[str(package)])
        return real(name, package_name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    [problem] = WebShopWorkflow.preflight({})
    assert f"{tmp_path}/data/items_human_ins.json does not exist" in problem and "setup.sh" in problem


class FakeShop:
    """WebShop's WebAgentTextEnv as the workflow uses it."""

    def __init__(self) -> None:
        self.sessions: list[int] = []
        self.actions: list[str] = []
        self.observation = ""
        self.page = {"has_search_bar": True, "clickables": ["search"]}

    def reset(self, session: int) -> None:
        self.sessions.append(session)
        self.observation = "WebShop [SEP] Instruction: red shoes under 50 dollars [SEP] Search"
        self.page = {"has_search_bar": True, "clickables": ["search"]}

    def get_available_actions(self) -> dict[str, Any]:
        return self.page

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.actions.append(action)
        if action.startswith("search"):
            self.page = PAGE
            return "Results: [button] Buy Now [button_]", 0.0, False, {}
        return "Thank you for shopping with us!", 0.75, True, {}


def test_webshop_episode_explains_unavailable_actions_and_keeps_its_env(make_model: Any) -> None:
    replies = [
        "<action>click[Buy Now]</action>",
        "<action>search[red shoes]</action>",
        "<action>click[Buy Now]</action>",
    ]
    model, _ = make_model(replies * 2)
    shop = FakeShop()
    cls = stand_in(WebShopWorkflow, shop)
    workflow = cls(task=make_task("webshop_workflow", {"task_id": 7}, prompt_key="task_id"), model=model)
    [exp] = workflow.run()
    assert shop.sessions == [7] and shop.actions == [
        "search[red shoes]",
        "click[Buy Now]",
    ]  # the first click is not sent
    assert exp.reward == 0.75
    assert exp.metrics == {"session_id": 7.0, "env_rounds": 2.0, "env_done": 1.0}
    assert model_text(model, exp) == "".join(r + "<eos>" for r in replies)
    explanation = "Incorrect action format, make sure you have the correct button name that is **within the current page**. The buttons you can click now are: ['search']"
    assert (
        other_text(model, exp)
        == "Observation: " + explanation + "Observation: Results: [button] Buy Now [button_]"
    )
    workflow.reset(make_task("webshop_workflow", {"task_id": 8}, prompt_key="task_id"))
    workflow.run()
    assert len(cls.made) == 1 and shop.sessions == [7, 8]  # one shop for every task
