"""WebShop: find and buy the product an instruction describes, on a text web shop (Trinity-RFT's webshop_workflow).

The task row's prompt column (`task_id` in Trinity's examples) is the WebShop session (goal)
index. The shop is WebShop's gym environment as Trinity makes it:
`gym.make("WebAgentTextEnv-v0", observation_mode="text_rich", num_products=None, human_goals=True)`
(after importing `web_agent_site.envs`), driven with `reset(session=...)`, `observation`,
`get_available_actions() -> {"has_search_bar": bool, "clickables": [...]}` and
`step(action) -> (obs, reward, done, info)`. It holds the whole product catalogue (about 15 GB of
memory), so one environment is made per workflow instance and kept across tasks.

A run plays `rollout_args.n` episodes of the session (the runner asks for repeat_times), each at
most 15 turns, and returns one experience per episode: the whole chat (replies with action mask
1). The model answers `<think>...</think><action>search[...]</action>` or `click[...]`; an action
the current page does not offer is not sent to the shop: the next user turn is an explanation
instead (reward 0, not done). The reward is the shop's reward when the episode ends with a
purchase, else -0.1. Metrics: env_rounds (index of the last round), env_done; info session_id.

Needs the `gym` package and WebShop's `web_agent_site` (installed from a checkout of
princeton-nlp/WebShop, whose setup script downloads the product data into its data/ folder);
`preflight` names whichever is missing. Tests replace `make_env` with a stand-in.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from services.common.experience import Experience
from services.explorer.workflows.base import Task
from services.explorer.workflows.text_env import (
    EnvWorkflow,
    Rules,
    missing_path,
    parse_action,
    play_game,
    sampling_args,
)

WEBSHOP_SYSTEM_PROMPT = """
You are an agent interacting with a virtual text-baed web shopping environments to testout your ability. Your job is to find follow the Instruction provided and mimic the steps to buy the item that are closest to the Instruct provided.

## Action Format:
You should give both the action_name and action_arg like the format `action_name[action_arg]`. You can execute two types of actions, search and click.
- When the button `[button] Search [button_]` is available in the current observation, you can execute the action <action>search[xxx]</action> (you should type the query you want to search in the square brackets here).
- You can click buttons `[button] xxx [button_]` that is available in the current observation, by execute the action <action>click[xxx]</action>.

Below are some examples of action formats.
- <action>search[white shoes]</action>
- <action>click[Buy Now]</action>

## Notes:
At each step, you should first think then perform action to fulfill the instruction. You should ALWAYS wrap your thinking with the <think> </think> tag and wrap your action with the <action> </action> tag.
You should ALWAYS take one action each step.
You should finish the task and buy the item within 15 steps.
DONOT try to interact with the user at anytime. Finish the task and buy the item by yourself.
"""

MAX_ENV_STEPS = 15
NOT_FINISHED_REWARD = -0.1
HUMAN_GOALS_FILE = "items_human_ins.json"  # the human-written instructions human_goals=True reads

_ACTION = re.compile(r"(.+)\[(.+)\]")
EMPTY_SEARCH = "Invalid action, please type in the query you want to search in the square brackets here."
NO_SEARCH_BAR = (
    "Can not perfrom search action without search bar. Please click the Back to Search button first."
)
UNKNOWN_BUTTON = (
    "Incorrect action format, make sure you have the correct button name that is **within the current "
    "page**. The buttons you can click now are: {clickables}"
)
BAD_FORMAT = "Invalid action. You should wrap your action with the <action> </action> tag and follow the action format."


def format_observation(observation: str) -> str:
    return "Observation: " + observation


def validate_action(action: str, available: dict[str, Any]) -> tuple[bool, str]:
    """(whether the shop can take `action` now, else the explanation shown to the model)."""
    match = _ACTION.match(action)
    name, arg = (match[1], match[2].lower()) if match else (action, None)
    clickables = available["clickables"]
    if name == "search":
        if not arg:
            return False, EMPTY_SEARCH
        return (True, "") if available["has_search_bar"] else (False, NO_SEARCH_BAR)
    if name == "click":
        return (True, "") if arg in clickables else (False, UNKNOWN_BUTTON.format(clickables=clickables))
    return False, BAD_FORMAT


def create_webshop_env() -> Any:
    import gym
    from web_agent_site.envs import WebAgentTextEnv  # noqa: F401  (registers WebAgentTextEnv-v0)

    return gym.make("WebAgentTextEnv-v0", observation_mode="text_rich", num_products=None, human_goals=True)


def webshop_data_dir() -> str | None:
    """The data/ folder beside the installed web_agent_site package (where WebShop reads its products)."""
    try:
        spec = importlib.util.find_spec("web_agent_site")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(os.path.dirname(list(spec.submodule_search_locations)[0]), "data")


class WebShopWorkflow(EnvWorkflow):
    """`webshop_workflow` (see the module docstring)."""

    can_repeat = True
    can_reset = True
    requires = (
        ("gym", "pip install gym"),
        ("web_agent_site", "install WebShop from a checkout of github.com/princeton-nlp/WebShop (setup.sh)"),
    )

    @classmethod
    def missing_data(cls, workflow_args: dict[str, Any]) -> list[str]:
        data = webshop_data_dir()  # None while web_agent_site itself is missing (reported above)
        if data is None or os.path.isfile(os.path.join(data, HUMAN_GOALS_FILE)):
            return []
        how = "run WebShop's setup.sh -d all in its checkout to download them"
        return [
            missing_path(cls.__name__, "WebShop's product data", os.path.join(data, HUMAN_GOALS_FILE), how)
        ]

    @classmethod
    def make_env(cls) -> Any:
        """The shop (tests override this with a stand-in)."""
        return create_webshop_env()

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        self.env = self.make_env()
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    def reset(self, task: Task) -> None:
        self.task = task
        self.session_id = int(task.task_desc or "0")

    def run(self) -> list[Experience]:
        return [exp for _ in range(int(self.task.rollout_args.n)) for exp in self.play()]

    def play(self) -> list[Experience]:
        env = self.env
        env.reset(session=self.session_id)
        observation = env.observation

        def act(reply: str) -> tuple[str, float, bool]:
            action = parse_action(reply)
            valid, explanation = validate_action(action, env.get_available_actions())
            if not valid:
                return explanation, 0.0, False
            obs, reward, done, _ = env.step(action)
            return obs, reward, done

        trajectory, episode = play_game(
            self.model,
            WEBSHOP_SYSTEM_PROMPT,
            observation,
            act,
            Rules(format_observation, MAX_ENV_STEPS, sampling_args(self.task)),
        )
        reward = episode.steps[-1].reward if episode.done else NOT_FINISHED_REWARD
        info = {"session_id": self.session_id, "env_rounds": episode.rounds, "env_done": int(episode.done)}
        return trajectory.experiences(reward, info)
