"""General multi-step workflows: an agent makes model calls through the OpenAI API, one experience per call.

Trinity-RFT's base classes for multi_step_grpo, with its names and loop. A subclass writes its agent
in `step(step_num)` (sync; `step_async` for the async variants) with `self.client`, the rollout
model's OpenAI-compatible client; every call made during a step is recorded by the model's history
(`explorer.rollout_model.enable_history: true`) and becomes one experience stamped with that step
number (`exp.step`, Trinity's `exp.eid.step`):

- StepWiseRewardWorkflow: `reward(exps, step_num)` scores each step's calls;
- RewardPropagationWorkflow: `reward(exps)` scores the whole run, and every call gets it
  (step_wise_grpo then uses the last step's reward of each run).

A run stops when `step` returns False, after `max_step_num` steps, or when a reply was cut by the
length limit. `ChatEnvWorkflow` (registered as `step_wise_chat_env_workflow`) is a ready-made
RewardPropagationWorkflow that plays an environment of services/explorer/workflows/multi_turn.py
(guess_number by default) as a chat, one OpenAI call per turn.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task, Workflow
from services.explorer.workflows.multi_turn import ENVIRONMENTS, Environment


class _HistoryWorkflow(Workflow):
    """Shared set-up: history must be on; `self.client` is the OpenAI client (or None)."""

    stop_on_truncation = True  # a reply cut by the length limit ends the run (Trinity's rule)

    def __init__(
        self,
        *,
        task: Task,
        model: Any,
        auxiliary_models: list[Any] | None = None,
        use_openai_client: bool = True,
    ) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        if not getattr(model, "enable_history", False):
            raise InvalidArgument(
                f"{type(self).__name__} builds one experience per model call from the model's "
                "history; set explorer.rollout_model.enable_history: true",
                field="explorer.rollout_model.enable_history",
            )
        self.client: Any = model.get_openai_client() if use_openai_client else None

    @property
    def max_step_num(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define max_step_num")

    def _collect(self, step: int) -> list[Experience]:
        exps = self.model.extract_experience_from_history()
        for exp in exps:
            exp.step = step
        return exps

    def _truncated(self, exps: list[Experience]) -> bool:
        return self.stop_on_truncation and any(e.info.get("finish_reason") == "length" for e in exps)


class StepWiseRewardWorkflow(_HistoryWorkflow):
    """Each step's calls get that step's reward."""

    def run(self) -> list[Experience]:
        experiences: list[Experience] = []
        for step in range(self.max_step_num):
            go_on = self.step(step_num=step)
            exps = self._collect(step)
            reward = self.reward(exps, step_num=step)
            for exp in exps:
                exp.reward = reward
            experiences.extend(exps)
            if self._truncated(exps) or not go_on:
                break
        return experiences

    def step(self, step_num: int) -> bool:
        """One step of the agent; returns whether to go on."""
        raise NotImplementedError

    def reward(self, exps: list[Experience], step_num: int) -> float:
        raise NotImplementedError


class AsyncStepWiseRewardWorkflow(StepWiseRewardWorkflow):
    is_async = True

    async def run_async(self) -> list[Experience]:
        experiences: list[Experience] = []
        for step in range(self.max_step_num):
            go_on = await self.step_async(step_num=step)
            exps = self._collect(step)
            reward = await self.reward_async(exps, step_num=step)
            for exp in exps:
                exp.reward = reward
            experiences.extend(exps)
            if self._truncated(exps) or not go_on:
                break
        return experiences

    async def step_async(self, step_num: int) -> bool:
        raise NotImplementedError

    async def reward_async(self, exps: list[Experience], step_num: int) -> float:
        raise NotImplementedError


class RewardPropagationWorkflow(_HistoryWorkflow):
    """The run's reward goes to every call of the run; metric actual_env_steps."""

    def run(self) -> list[Experience]:
        experiences: list[Experience] = []
        steps = 0
        for step in range(self.max_step_num):
            go_on = self.step(step_num=step)
            exps = self._collect(step)
            experiences.extend(exps)
            steps = step + 1
            if self._truncated(exps) or not go_on:
                break
        return self._propagate(experiences, self.reward(experiences), steps)

    @staticmethod
    def _propagate(experiences: list[Experience], reward: float, steps: int) -> list[Experience]:
        for exp in experiences:
            exp.reward = reward
            exp.metrics["actual_env_steps"] = float(steps)
        return experiences

    def step(self, step_num: int) -> bool:
        raise NotImplementedError

    def reward(self, exps: list[Experience]) -> float:
        raise NotImplementedError


class AsyncRewardPropagationWorkflow(RewardPropagationWorkflow):
    is_async = True

    async def run_async(self) -> list[Experience]:
        experiences: list[Experience] = []
        steps = 0
        for step in range(self.max_step_num):
            go_on = await self.step_async(step_num=step)
            exps = self._collect(step)
            experiences.extend(exps)
            steps = step + 1
            if self._truncated(exps) or not go_on:
                break
        return self._propagate(experiences, await self.reward_async(experiences), steps)

    async def step_async(self, step_num: int) -> bool:
        raise NotImplementedError

    async def reward_async(self, exps: list[Experience]) -> float:
        raise NotImplementedError


class ChatEnvWorkflow(RewardPropagationWorkflow):
    """Play an environment as a chat over the OpenAI API: one call per turn, the run's return as reward.

    workflow_args: `env` (registered environment, default guess_number), `env_args`, `max_turns`
    (default 5), `stop_on_truncation` (default true: a reply cut by the length limit ends the run;
    false: it is played as it is). The conversation is the system prompt (format.system_prompt), the environment's
    first observation as the user turn, then alternating replies and observations. For gigpo each
    experience's info gets `env_state_hash` (sha256 of the whole conversation the call answered: the
    same history is the same state) and `step_reward` (the environment's reward for that turn).
    """

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        args = task.workflow_args
        env_cls = ENVIRONMENTS.get(str(args.get("env", "guess_number")), field="workflow_args.env")
        self.env: Environment = env_cls(**args.get("env_args", {}))
        self.max_turns = int(args.get("max_turns", 5))
        self.stop_on_truncation = bool(args.get("stop_on_truncation", True))
        system = task.format_args.system_prompt
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.messages.append({"role": "user", "content": self.env.reset(task)})
        self.total, self.success = 0.0, 0.0
        self.step_meta: list[tuple[str, float]] = []  # (hash of the conversation answered, step reward)

    @property
    def max_step_num(self) -> int:
        return self.max_turns

    def run(self) -> list[Experience]:
        experiences = super().run()
        for exp in experiences:
            if exp.step < len(self.step_meta):
                exp.info["env_state_hash"], exp.info["step_reward"] = self.step_meta[exp.step]
        return experiences

    def step(self, step_num: int) -> bool:
        sampling = self.task.rollout_args.sampling()
        reply = self.client.chat.completions.create(
            model=self.client.model_path,
            messages=self.messages,
            temperature=sampling.get("temperature", 1.0),
            max_tokens=sampling.get("max_tokens"),
            n=1,
        )
        text = reply.choices[0].message.content or ""
        state = hashlib.sha256(json.dumps(self.messages, sort_keys=True).encode()).hexdigest()
        observation, reward, done = self.env.step(text)
        self.step_meta.append((state, float(reward)))
        self.total += reward
        self.messages += [{"role": "assistant", "content": text}, {"role": "user", "content": observation}]
        if done:
            self.success = 1.0 if reward > 0 else 0.0
        return not done

    def reward(self, exps: list[Experience]) -> float:
        for exp in exps:
            exp.metrics["accuracy"] = self.success
        return self.total
