"""Multi-turn workflow over a small environment interface: reset -> observation, step -> (observation, reward, done).

The trajectory is built token by token: the model's actions are appended as generated (action
mask 1, their sampling logprobs) and the environment's observations as tokenized text (action mask
0, logprob 0), so the trainer never learns to produce environment text and never re-tokenizes
what the model said. `workflow_args`:
- `env`: registered environment name or dotted path (default `guess_number`); `env_args`: its kwargs;
- `max_turns` (default 5); `observation_template` (default "\\n{observation}\\n");
- `step_wise`: also/instead emit one experience per turn (context as prompt, the action as response),
  each carrying the episode's return (Trinity's step-wise reward workflows).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

import numpy as np

from services.common.experience import Experience
from services.common.registry import Registry
from services.explorer.workflows.base import ResettableWorkflow, Task

ENVIRONMENTS = Registry(
    "environment",
    {"guess_number": "services.explorer.workflows.multi_turn:GuessNumberEnv"},
    config_key="workflow_args.env",
    plugin_hint="a module in explorer.plugin_dirs that registers it",
)


class Environment(ABC):
    """A small environment: text in, text out, a reward per step."""

    @abstractmethod
    def reset(self, task: Task) -> str:
        """Start an episode for `task`; returns the first observation."""

    @abstractmethod
    def step(self, action: str) -> tuple[str, float, bool]:
        """Apply the model's action; returns (observation, reward, done)."""


class GuessNumberEnv(Environment):
    """Guess an integer in [low, high]: the environment answers "higher", "lower" or "correct" (reward 1)."""

    def __init__(self, low: int = 0, high: int = 100) -> None:
        self.low, self.high, self.target = low, high, low

    def reset(self, task: Task) -> str:
        self.low = int(task.raw_task.get("low", self.low))
        self.high = int(task.raw_task.get("high", self.high))
        self.target = int(task.raw_task["target"])
        return f"Guess a number between {self.low} and {self.high}."

    def step(self, action: str) -> tuple[str, float, bool]:
        numbers = re.findall(r"-?\d+", action)
        if not numbers:
            return "Answer with a number.", 0.0, False
        guess = int(numbers[-1])
        if guess == self.target:
            return "Correct!", 1.0, True
        return ("Higher." if guess < self.target else "Lower."), 0.0, False


class StepWiseEnvWorkflow(ResettableWorkflow):
    """Plays one episode per run (the runner repeats it repeat_times times)."""

    is_async = True

    def reset(self, task: Task) -> None:
        self.task = task
        args = task.workflow_args
        env_cls = ENVIRONMENTS.get(str(args.get("env", "guess_number")), field="workflow_args.env")
        self.env: Environment = env_cls(**args.get("env_args", {}))
        self.max_turns = int(args.get("max_turns", 5))
        self.template = str(args.get("observation_template", "\n{observation}\n"))
        self.step_wise = bool(args.get("step_wise", False))

    def _first_prompt(self, observation: str) -> list[int]:
        system = self.task.format_args.system_prompt
        if self.task.format_args.prompt_type == "messages":
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": observation}
            ]
            return self.model.tokenize(self.model.render_chat(messages))
        return self.model.tokenize((system + "\n" if system else "") + observation + "\n")

    async def run_async(self) -> list[Experience]:
        observation = self.env.reset(self.task)
        tokens = self._first_prompt(observation)
        prompt_length = len(tokens)
        logprobs: list[float] = []
        mask: list[bool] = []
        sampling = {**self.task.rollout_args.sampling(), "n": 1}
        total, turns, success, turn_exps, version = 0.0, 0, 0.0, [], self.model.model_version
        for turn in range(self.max_turns):
            if len(tokens) >= self.model.max_prompt_tokens:
                break
            exp = (await self.model.generate_tokens_async(tokens, **sampling))[0]
            version = exp.model_version
            action = exp.tokens[exp.prompt_length :].tolist()
            turn_exps.append(exp)
            tokens, logprobs, mask = (
                tokens + action,
                logprobs + exp.logprobs.tolist(),
                mask + [True] * len(action),
            )
            observation, reward, done = self.env.step(exp.response_text)
            total, turns = total + reward, turns + 1
            if done:
                success = 1.0 if reward > 0 else 0.0
                break
            if turn < self.max_turns - 1:
                obs_ids = self.model.tokenize(self.template.format(observation=observation))
                tokens, logprobs, mask = (
                    tokens + obs_ids,
                    logprobs + [0.0] * len(obs_ids),
                    mask + [False] * len(obs_ids),
                )
        metrics = {"turns": float(turns), "accuracy": success}
        if self.step_wise:
            for exp in turn_exps:
                exp.reward, exp.metrics = total, dict(metrics)
            return turn_exps
        return [
            Experience(
                tokens=np.asarray(tokens, dtype=np.int64),
                prompt_length=prompt_length,
                model_version=version,
                reward=total,
                logprobs=np.asarray(logprobs, dtype=np.float32),
                action_mask=np.asarray(mask, dtype=bool),
                metrics=metrics,
            )
        ]
