"""ALFWorld: household tasks played as text games (Trinity-RFT's alfworld workflows).

The task row's prompt column (`format.prompt_key`, `game_file` in Trinity's examples) is the path
of one ALFWorld game (`.../json_2.1.1/<split>/<task>/<trial>/game.tw-pddl`, listed by Trinity's
examples/grpo_alfworld/get_alfworld_data.py). The game is played through TextWorld's gym interface
as Trinity plays it, one game at a time (no batch): `obs, info = env.reset()`,
`obs, reward, done, info = env.step(command)`, `env.close()`; the reward is 1 when the task is done.

Each turn the model sees the observation ("Observation: ..."; a "Nothing happens." observation
gets a hint to check the action's format) and answers `<think>...</think><action>...</action>`.
The run's reward is the environment's reward on the step that finished the game, or -0.1 when
`workflow_args.max_env_steps` (default 30) steps pass without finishing.

- `alfworld_workflow`: one experience per run, the whole chat (replies with action mask 1);
  metrics env_rounds (index of the last round) and env_done.
- `step_wise_alfworld_workflow` (for multi_step_grpo): one experience per model call, each with
  `step` = the call's index in the run and the run's reward; info `env_state_hash` (sha256 of the
  observation the call answered) and `step_reward`; metric actual_env_steps. Like Trinity it reads
  the calls from the model's history (`explorer.rollout_model.enable_history: true`), and a reply
  cut by the length limit ends the run.

Needs the `alfworld` and `textworld` packages and the ALFWorld data (`alfworld-download`, into
$ALFWORLD_DATA, default ~/.cache/alfworld); `preflight` names whichever is missing. Tests replace
`make_env` with a stand-in that has the same interface.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from services.common.experience import Experience
from services.explorer.workflows.base import Task
from services.explorer.workflows.step_wise import RewardPropagationWorkflow
from services.explorer.workflows.text_env import (
    EnvWorkflow,
    Rules,
    missing_path,
    parse_action,
    play_game,
    sampling_args,
    tagged_actions,
)

# The command list both alfworld prompts show; Trinity's two copies differ only in the padding of
# the "move" line, kept as they are.
_COMMANDS = """  look:                             look around your current location
  inventory:                        check your current inventory(you can only have 1 item in your inventory)
  go to (receptacle):               move to a receptacle
  open (receptacle):                open a receptacle
  close (receptacle):               close a receptacle
  take (object) from (receptacle):  take an object from a receptacle
  move (object) to (receptacle):{move_gap}place an object in or on a receptacle
  examine (something):              examine a receptacle or an object
  use (object):                     use an object
  heat (object) with (receptacle):  heat an object using a receptacle
  clean (object) with (receptacle): clean an object using a receptacle
  cool (object) with (receptacle):  cool an object using a receptacle
  slice (object) with (object):     slice an object using a sharp object"""


def alfworld_commands(move_gap: str) -> str:
    return _COMMANDS.format(move_gap=move_gap)


ALFWORLD_SYSTEM_PROMPT = f"""
You are an agent interacting with a virtual text-based environment.

## Notes:
At each step, you should first think then perform action to fulfill the instruction. You should ALWAYS wrap your thinking with the <think> </think> tag and wrap your action with the <action> </action> tag.
You should ALWAYS take one action each step.
DO NOT try to interact with the user at anytime. Finish the task by yourself.

## Action Format:
Below are the available commands you can use:
{alfworld_commands("  ")}

For example your output should be like this:
<think> To solve the task, I need first to ... </think><action>go to cabinet 1</action>
"""

INVALID_ACTION_HINT = (
    "Please check if the action you take is valid or you have carefully followed the action format."
)
NOT_FINISHED_REWARD = -0.1  # Trinity's reward for a game that was not finished


def format_observation(observation: str) -> str:
    """The user turn for an observation; "Nothing happens." (a command the game refused) gets a hint."""
    if "Nothing happens." in observation:
        observation += INVALID_ACTION_HINT
    return "Observation: " + observation


def alfworld_data_dir() -> str:
    """Where alfworld keeps its data: $ALFWORLD_DATA, else ~/.cache/alfworld (alfworld.info's default)."""
    return os.environ.get("ALFWORLD_DATA") or os.path.expanduser("~/.cache/alfworld")


def create_alfworld_env(game_file: str) -> Any:
    """One TextWorld gym environment for `game_file`, wrapped as Trinity wraps it (hand-coded expert)."""
    import textworld
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredExpertType,
    )

    expert = AlfredExpert(expert_type=AlfredExpertType.HANDCODED)
    infos = textworld.EnvInfos(description=True, inventory=True, admissible_commands=True)
    env_id = textworld.gym.register_game(game_file, infos, wrappers=[AlfredDemangler(), expert])
    return textworld.gym.make(env_id)


class AlfworldEnvironment(EnvWorkflow):
    """The ALFWorld parts every alfworld workflow shares: packages, data check, the game to play."""

    requires = (
        ("alfworld", "pip install alfworld, then run alfworld-download for its data"),
        ("textworld", "pip install textworld"),
    )

    @classmethod
    def missing_data(cls, workflow_args: dict[str, Any]) -> list[str]:
        data = os.path.join(alfworld_data_dir(), "json_2.1.1")
        if os.path.isdir(data):
            return []
        where = (
            "$ALFWORLD_DATA" if os.environ.get("ALFWORLD_DATA") else "~/.cache/alfworld (ALFWORLD_DATA unset)"
        )
        how = (
            "set ALFWORLD_DATA and run alfworld-download, then list the games with Trinity's "
            "examples/grpo_alfworld/get_alfworld_data.py"
        )
        return [missing_path(cls.__name__, f"the ALFWorld game files (json_2.1.1 under {where})", data, how)]

    @classmethod
    def make_env(cls, game_file: str) -> Any:
        """The environment for one game (tests override this with a stand-in)."""
        return create_alfworld_env(game_file)

    @staticmethod
    def game_file(task: Task) -> str:
        """The game's path: the prompt column, else raw_task['game_file'] (Trinity's fallbacks)."""
        return task.task_desc or str(task.raw_task.get("game_file", "")) or "0"


class AlfworldWorkflow(AlfworldEnvironment):
    """`alfworld_workflow`: one game per run, one experience holding the whole chat."""

    can_reset = True

    def reset(self, task: Task) -> None:
        self.task = task
        self.max_env_steps = int(task.workflow_args.get("max_env_steps", 30))

    def run(self) -> list[Experience]:
        env = self.make_env(self.game_file(self.task))
        try:
            observation, _info = env.reset()
            trajectory, episode = play_game(
                self.model,
                ALFWORLD_SYSTEM_PROMPT,
                observation,
                tagged_actions(env),
                Rules(format_observation, self.max_env_steps, sampling_args(self.task)),
            )
        finally:
            env.close()  # a TextWorld game holds a subprocess
        reward = episode.steps[-1].reward if episode.done else NOT_FINISHED_REWARD
        return trajectory.experiences(reward, {"env_rounds": episode.rounds, "env_done": int(episode.done)})


class StepWiseAlfworldWorkflow(AlfworldEnvironment, RewardPropagationWorkflow):
    """`step_wise_alfworld_workflow`: one experience per model call, all with the run's reward."""

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        RewardPropagationWorkflow.__init__(
            self, task=task, model=model, auxiliary_models=auxiliary_models, use_openai_client=False
        )
        self.max_env_steps = int(task.workflow_args.get("max_env_steps", 30))
        self.env = self.make_env(self.game_file(task))
        self.observation = ""
        self.done = False
        self.final_reward = NOT_FINISHED_REWARD
        self.memory: list[dict[str, str]] = []
        self.step_meta: list[tuple[str, float]] = []  # (hash of the observation answered, step reward)

    @property
    def max_step_num(self) -> int:
        return self.max_env_steps

    def run(self) -> list[Experience]:
        try:
            self.observation, _info = self.env.reset()
            self.done, self.final_reward = False, NOT_FINISHED_REWARD
            self.memory = [{"role": "system", "content": ALFWORLD_SYSTEM_PROMPT}]
            self.step_meta = []
            experiences = super().run()
        finally:
            self.env.close()
        for exp in experiences:
            if exp.step < len(self.step_meta):
                exp.info["env_state_hash"], exp.info["step_reward"] = self.step_meta[exp.step]
        return experiences

    def step(self, step_num: int) -> bool:
        if self.done:
            return False
        shown = format_observation(self.observation)
        self.memory.append({"role": "user", "content": shown})
        reply = self.model.chat(self.memory, **sampling_args(self.task))[0].response_text
        self.memory.append({"role": "assistant", "content": reply})
        self.observation, reward, self.done, _ = self.env.step(parse_action(reply))
        self.step_meta.append((hashlib.sha256(shown.encode()).hexdigest(), float(reward)))
        if self.done:
            self.final_reward = float(reward)
        return not self.done

    def reward(self, exps: list[Experience]) -> float:
        return self.final_reward
