"""ScienceWorld: elementary-science experiments played as a text game (Trinity-RFT's sciworld_workflow).

The task row's prompt column (`task_desc` in Trinity's examples) is a JSON object
`{"task_name": ..., "var_num": ..., "jar_path": ...}` (Trinity's
examples/grpo_sciworld/get_sciworld_data.py). The game is ScienceWorld's Python interface as
Trinity drives it: `ScienceWorldEnv("", jar_path, envStepLimit=100)`, then
`load(task_name, var_num, "easy", generateGoldPath=True)`, `get_gold_action_sequence()`,
`reset() -> (obs, info)`, `get_task_description()`, `step(command) -> (obs, reward, done, info)`
(reward: the change of the 0-100 score), `close()`. Without a `jar_path` the package's own jar
is used.

A run plays `rollout_args.n` episodes of the task on one environment (the runner asks for
repeat_times), each at most 30 turns, and returns one experience per episode: the whole chat
(replies with action mask 1). The first observation is prefixed with the task description; each
user turn is "Observation: \\n" + the observation; the model answers
`<think>...</think><action>...</action>`. The reward is the best running total of the step
rewards during the episode, divided by 100 (0 to 1). Metrics: env_rounds (index of the last
round), env_done, golden_rounds (length of the gold action sequence).

Needs the `scienceworld` package and a Java runtime (it runs the simulator in a JVM); `preflight`
names whichever is missing. Tests replace `make_env` with a stand-in of the same interface.
"""

from __future__ import annotations

import json
import shutil
from itertools import accumulate
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task
from services.explorer.workflows.text_env import EnvWorkflow, Rules, play_game, sampling_args, tagged_actions

SCIWORLD_SYSTEM_PROMPT = """
You are an agent, you job is to do some scientific experiment in a virtual test-based environments.

## Notes:
At each step, you should first think then perform action to fulfill the instruction. You should ALWAYS wrap your thinking with the <think> </think> tag and wrap your action with the <action> </action> tag.
You should ALWAYS take one action each step.
DONOT try to interact with the user at anytime. Finish the task by yourself.

## Action Format:
Below are the available commands you can use:
    open OBJ: open a container
    close OBJ: close a container
    activate OBJ: activate a device
    deactivate OBJ: deactivate a device
    connect OBJ to OBJ: connect electrical components
    disconnect OBJ: disconnect electrical components
    use OBJ [on OBJ]: use a device/item
    look around: describe the current room
    examine OBJ: describe an object in detail
    look at OBJ: describe a container's contents
    read OBJ: read a note or book
    move OBJ to OBJ: move an object to a container
    pick up OBJ: move an object to the inventory
    pour OBJ into OBJ: pour a liquid into a container
    mix OBJ: chemically mix a container
    teleport to LOC: teleport to a specific room
    focus on OBJ: signal intent on a task object
    wait: task no action for 10 steps
    wait1: task no action for a step

For example your output should be like this:
<think> Now I will check the bedroom ... </think><action>teleport to bedroom</action>
"""

MAX_ENV_STEPS = 30  # Trinity's fixed turn limit (below the environment's own limit of 100)
ENV_STEP_LIMIT = 100
SIMPLIFICATION = "easy"


def format_observation(observation: str) -> str:
    return "Observation: \n" + observation


def episode_reward(step_rewards: list[float]) -> float:
    """The best running total of the step rewards (never below 0), scaled from 0-100 to 0-1."""
    return max([0.0, *accumulate(step_rewards)]) / 100.0


def create_sciworld_env(task_config: dict[str, Any]) -> Any:
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv("", task_config.get("jar_path") or None, envStepLimit=ENV_STEP_LIMIT)
    env.load(task_config["task_name"], task_config["var_num"], SIMPLIFICATION, generateGoldPath=True)
    return env


class SciWorldWorkflow(EnvWorkflow):
    """`sciworld_workflow` (see the module docstring)."""

    can_repeat = True
    can_reset = True
    requires = (("scienceworld", "pip install scienceworld"),)

    @classmethod
    def missing_data(cls, workflow_args: dict[str, Any]) -> list[str]:
        if shutil.which("java") is not None:
            return []
        return [
            f"{cls.__name__} needs a Java runtime for the ScienceWorld simulator, and no `java` is on "
            "PATH (install a JRE, e.g. apt-get install default-jre-headless)"
        ]

    @classmethod
    def make_env(cls, task_config: dict[str, Any]) -> Any:
        """The environment for one task configuration (tests override this with a stand-in)."""
        return create_sciworld_env(task_config)

    def reset(self, task: Task) -> None:
        self.task = task
        text = task.task_desc or "0"
        try:
            config = json.loads(text)
        except json.JSONDecodeError:
            config = None
        if not isinstance(config, dict) or not {"task_name", "var_num"} <= set(config):
            raise InvalidArgument(
                f"a sciworld task's {task.format_args.prompt_key!r} column must be a JSON object with "
                f"task_name and var_num (and jar_path), got {text[:80]!r}",
                field=f"format.prompt_key ({task.format_args.prompt_key})",
            )
        self.task_config = config

    def run(self) -> list[Experience]:
        env = self.make_env(self.task_config)
        try:
            golden_rounds = len(env.get_gold_action_sequence())
            return [
                exp for _ in range(int(self.task.rollout_args.n)) for exp in self.play(env, golden_rounds)
            ]
        finally:
            env.close()  # the simulator's JVM

    def play(self, env: Any, golden_rounds: int) -> list[Experience]:
        observation, _info = env.reset()
        observation = f"Task Description: {env.get_task_description()}\n{observation}"
        trajectory, episode = play_game(
            self.model,
            SCIWORLD_SYSTEM_PROMPT,
            observation,
            tagged_actions(env),
            Rules(format_observation, MAX_ENV_STEPS, sampling_args(self.task)),
        )
        reward = episode_reward([step.reward for step in episode.steps])
        info = {"env_rounds": episode.rounds, "env_done": int(episode.done), "golden_rounds": golden_rounds}
        return trajectory.experiences(reward, info)
