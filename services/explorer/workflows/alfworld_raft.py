"""RAFT on ALFWorld: keep only good trajectories, as supervised data (Trinity-RFT's RAFT workflows).

The model answers every turn with three tags, `<experience>` (general lessons for this kind of
task), `<think>` and `<action>`; a reply is well formed when all three are present and non-empty.
A rollout plays one game (see alfworld.py for the game and its interface) for at most
`workflow_args.max_env_steps` turns (default 50, Trinity's fixed value) and stops early, failed
with reward 0, when the last three actions are the same. Sampling uses the task's temperature,
top_k and top_p (Trinity's fallbacks when a task has none: 1.0, 20, 0.95) with max_tokens 4096.

- `RAFT_alfworld_workflow`: a rollout that finished the game (reward >= 1) with every reply well
  formed becomes one experience (the whole chat, replies trained on); anything else yields a
  placeholder experience with no trainable token (metrics success / reward / steps only).
- `RAFT_reflect_alfworld_workflow`: the same, but when the first rollout did not succeed the game
  is played again with the first chat and a feedback message as context. The second chat, written
  as a fresh conversation (system prompt, observations, the second rollout's replies), is kept
  when all its replies are well formed and it got a higher reward, or reached reward 1 in fewer
  steps. Each such case is also written as JSON to `workflow_args.save_dir` (default
  RAFT_reflect_alfworld_data, Trinity's folder; "" writes nothing), under sft_data/ or
  non_sft_data/.

Evaluation tasks play one rollout and report success / reward / steps on a placeholder.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.workflows.alfworld import AlfworldEnvironment, alfworld_commands, format_observation
from services.explorer.workflows.base import Task
from services.explorer.workflows.text_env import ChatTrajectory, Rules, numeric_metrics, play_episode

log = get_logger("explorer.workflows.alfworld_raft")

RAFT_SYSTEM_PROMPT = f"""You are an agent interacting with a virtual text-based environment.

## Response Format:
You MUST use this exact format for every response. All three tags are REQUIRED in sequential order:

<experience>Working principles, strategies, common knowledge, and potential pitfalls relevant to the current task.</experience>\\n\\n
<think>your reasoning process</think>\\n\\n
<action>exactly one action command</action>

## Action Commands:
{alfworld_commands("    ")}

For example your output should be like this:
<experience>In household tasks, I should start by exploring the environment to understand available objects and receptacles. Common pitfalls include forgetting to check inventory capacity and not examining objects before taking action.</experience>\\n\\n<think> To solve the task, I need first to ... </think>\\n\\n<action>go to cabinet 1</action>

## Important Note:
You must ensure that the <experience> section contains descriptions of working principles, strategies, common sense knowledge, and potential pitfalls that are universally applicable to this type of task, rather than generic statements, placeholder content, or overly specific behavioral guidelines."""

SECOND_ATTEMPT_GUIDANCE = (
    "{reward_feedback}\n\nThis is your second attempt. You need to perform better this time. Focus on "
    "updating a more thoughtful and comprehensive <experience>...</experience> section that incorporates "
    "strategies, common pitfalls, and domain knowledge to help improve task performance and avoid previous "
    "mistakes. Learn from your first attempt and apply that knowledge to make better decisions. IMPORTANT: "
    "You must update your experience based on what you learned from the first attempt. Also, DO NOT repeat "
    "the same action consecutively as this is inefficient and useless - if you find yourself repeating "
    "actions, stop and try a different approach. In your responses, do not explicitly mention this is a "
    "second attempt or reference previous attempts. Instead, present your actions as if starting fresh, "
    "but incorporate general experience and strategies you can summarize for this type of task."
)

_RESPONSE = re.compile(
    r"<experience>\s*(.*?)\s*</experience>.*?<think>\s*(.*?)\s*</think>.*?<action>\s*(.*?)\s*</action>",
    re.DOTALL,
)


def parse_response(response: str) -> dict[str, str]:
    """The experience, think and action parts, in that order; all "" unless all three tags appear."""
    match = _RESPONSE.search(response)
    if match is None:
        return {"experience": "", "think": "", "action": ""}
    return {"experience": match[1].strip(), "think": match[2].strip(), "action": match[3].strip()}


def well_formed(parsed: dict[str, str]) -> bool:
    return all(parsed[key].strip() for key in ("experience", "think", "action"))


def reward_feedback(reward: float, steps: int, done: bool, max_env_steps: int) -> str:
    """Trinity's sentence about the first attempt, shown before the second one."""
    if done and reward >= 1:
        return (
            f"In your attempt, you successfully completed the task in {steps} steps with a reward of "
            f"{reward:.3f}. Try to maintain this success while being more efficient."
        )
    if done:
        return (
            f"In your attempt, you completed the task in {steps} steps but only achieved a reward of "
            f"{reward:.3f}. You need to improve your performance to achieve full success."
        )
    if steps >= max_env_steps:
        return (
            f"In your attempt, you reached the maximum step limit of {max_env_steps} steps without "
            f"completing the task (reward: {reward:.3f}). You need to be more efficient and focused to "
            "complete the task within the step limit."
        )
    return (
        f"In your attempt, you stopped after {steps} steps with a reward of {reward:.3f} without "
        "completing the task. You need to improve your strategy and persistence to achieve success."
    )


def placeholder(reason: str = "Unknown error", *, info: Any = None, metrics: Any = None) -> Experience:
    """Trinity's "empty" experience: one token, nothing to train on, only metrics and info."""
    return Experience(
        tokens=np.zeros(1, dtype=np.int64),
        prompt_length=0,
        model_version=0,
        action_mask=np.zeros(1, dtype=bool),
        info=info if info is not None else {"error_reason": reason, "rollout_failed": True},
        metrics=metrics if metrics is not None else {"success": 0.0, "reward": 0.0},
    )


@dataclass
class Attempt:
    """One rollout: its chat, outcome and every reply's parsed parts."""

    trajectory: ChatTrajectory
    reward: float = 0.0
    done: bool = False
    steps: int = 0
    parsed: list[dict[str, str]] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return self.done and self.reward >= 1

    @property
    def well_formed(self) -> bool:
        return all(well_formed(p) for p in self.parsed)

    def outcome(self) -> dict[str, Any]:
        return {"success": self.success, "reward": self.reward, "steps": self.steps}


class RAFTAlfworldWorkflow(AlfworldEnvironment):
    """`RAFT_alfworld_workflow` (see the module docstring)."""

    can_reset = True

    def reset(self, task: Task) -> None:
        self.task = task
        rollout = task.rollout_args
        self.max_env_steps = int(task.workflow_args.get("max_env_steps", 50))
        sampling = {
            "n": 1,
            "temperature": rollout.get("temperature", 1.0),
            "top_k": rollout.get("top_k", 20),
            "top_p": rollout.get("top_p", 0.95),
            "max_tokens": 4096,
        }
        self.rules = Rules(format_observation, self.max_env_steps, sampling)

    def rollout(
        self,
        *,
        check_repeats: bool = True,
        context: ChatTrajectory | None = None,
        lead: tuple[dict[str, str], ...] = (),
    ) -> Attempt:
        """Play the game once. With `context` (a chat ending with a reply), replies are sampled after
        it, the `lead` messages and the game's first observation; the attempt's trajectory is then
        the fresh conversation (system prompt, observations) holding those replies."""
        env = self.make_env(self.game_file(self.task))
        try:
            observation, _info = env.reset()
            opening = self.rules.opening(RAFT_SYSTEM_PROMPT, observation)
            attempt = Attempt(ChatTrajectory(self.model, opening))
            sampler = attempt.trajectory
            if context is not None:
                sampler = context
                sampler.add_messages([*lead, opening[1]])
            recent: list[str] = []

            def act(reply: str) -> tuple[str, float, bool] | None:
                parsed = parse_response(reply.strip())
                attempt.parsed.append(parsed)
                recent[:] = [*recent[-2:], parsed["action"]]
                if check_repeats and len(recent) == 3 and len(set(recent)) == 1:
                    return None  # three identical actions in a row: stop, failed
                obs, reward, done, _ = env.step(parsed["action"])
                return obs, reward, done

            mirror = attempt.trajectory if context is not None else None
            episode = play_episode(sampler, act, self.rules, mirror=mirror)
        finally:
            env.close()
        last = episode.steps[-1] if episode.steps else None
        attempt.steps = len(episode.steps)
        attempt.done = episode.done
        attempt.reward = last.reward if last is not None and last.acted else 0.0
        return attempt

    def first_attempt(self) -> Attempt | Experience:
        """The first rollout, or the placeholder Trinity returns when it raised."""
        try:
            return self.rollout()
        except Exception as exc:  # noqa: BLE001 - Trinity reports a failed rollout as a placeholder
            log.warning(
                "raft_rollout_failed", task_id=self.task.task_id, error=f"{type(exc).__name__}: {exc}"
            )
            return placeholder(f"{'Eval' if self.task.is_eval else 'Training'} rollout failed: {exc}")

    def kept(self, attempt: Attempt) -> Experience:
        """The successful chat as the training experience (reward = the game's reward)."""
        return attempt.trajectory.experience(attempt.reward, attempt.outcome())

    def run(self) -> list[Experience]:
        if self.task.is_eval:
            return [self.evaluate()]
        attempt = self.first_attempt()
        if isinstance(attempt, Experience):
            return [attempt]
        if attempt.reward >= 1 and attempt.well_formed:
            return [self.kept(attempt)]
        if attempt.reward >= 1:
            return [self.not_kept(attempt)]
        return self.after_failure(attempt)

    def not_kept(self, attempt: Attempt) -> Experience:
        return placeholder(
            "Experience conversion failed: Trajectory format invalid",
            metrics=numeric_metrics(attempt.outcome()),
        )

    def after_failure(self, attempt: Attempt) -> list[Experience]:
        """What a failed first rollout yields: here the placeholder with its outcome."""
        return [self.not_kept(attempt)]

    def evaluate(self) -> Experience:
        attempt = self.first_attempt()
        if isinstance(attempt, Experience):
            return attempt
        outcome = attempt.outcome()
        return placeholder(
            info={"task_id": datetime.now().strftime("%Y%m%d_%H%M%S_%f"), **outcome},
            metrics=numeric_metrics(outcome),
        )


class RAFTReflectAlfworldWorkflow(RAFTAlfworldWorkflow):
    """`RAFT_reflect_alfworld_workflow` (see the module docstring)."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.save_dir = str(task.workflow_args.get("save_dir", "RAFT_reflect_alfworld_data"))

    def after_failure(self, first: Attempt) -> list[Experience]:
        """Reflect: replay the game with the failed chat as context; keep the replay if it did better."""
        if not first.trajectory.replies:
            return [placeholder("Training rollout failed: the first prompt does not fit the model")]
        try:
            second = self.second_attempt(first)
        except Exception as exc:  # noqa: BLE001 - as Trinity: the failed reflection becomes a placeholder
            log.warning(
                "raft_reflection_failed", task_id=self.task.task_id, error=f"{type(exc).__name__}: {exc}"
            )
            return [placeholder(f"SFT data construction failed: {exc}")]
        improved = second.reward > first.reward
        faster = second.steps < first.steps
        metrics = {
            "reward": float(first.reward),
            "steps": float(first.steps),
            "trajectory_length": float(len(second.parsed)),
            "second_reward": float(second.reward),
            "second_steps": float(second.steps),
            "improvement": 1.0 if improved else 0.0,
        }
        keep = second.well_formed and (improved or (faster and second.reward >= 1.0))
        self.save(first, second, keep)
        if keep and second.trajectory.replies:
            exp = second.trajectory.experience(second.reward, metrics, keep_logprobs=False)
            return [exp]
        return [placeholder()]

    def second_attempt(self, first: Attempt) -> Attempt:
        """Replay the game after the first chat and a feedback message; no repeat check (as Trinity)."""
        feedback = reward_feedback(first.reward, first.steps, first.success, self.max_env_steps)
        guidance = {"role": "system", "content": SECOND_ATTEMPT_GUIDANCE.format(reward_feedback=feedback)}
        return self.rollout(check_repeats=False, context=first.trajectory.copy(), lead=(guidance,))

    def save(self, first: Attempt, second: Attempt, keep: bool) -> None:
        """One JSON file per reflected task (Trinity's record of both attempts)."""
        if not self.save_dir:
            return
        task_id = datetime.now().strftime("%Y%m%d_%H%M%S_%f")
        record = {
            "task_id": task_id,
            "timestamp": datetime.now().isoformat(),
            "game_file": self.game_file(self.task),
            "first_exploration": {"trajectory": first.trajectory.messages, **first.outcome()},
            "second_exploration": {
                "trajectory": second.trajectory.messages,
                **second.outcome(),
                "success": second.reward >= 1,
            },
            "training_data": second.trajectory.messages,
            "kept_for_sft": keep,
        }
        folder = os.path.join(self.save_dir, "sft_data" if keep else "non_sft_data")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{task_id}.json"), "w", encoding="utf-8") as handle:
            json.dump(record, handle, ensure_ascii=False, indent=2)
