"""Rewards from a model: Trinity-RFT's reward-model and RULER workflows (rubric judges: rubric_judge.py).

- `math_rm_workflow` / `async_math_rm_workflow`: the reward fn (default `rm_gallery_reward`) is
  called Trinity's RM-Gallery way, `fn(experience, messages, ground_truth=truth)`, and the reward is
  its `reward` part when it returns one (trajectory_accuracy_grader_reward), else the sum of the
  parts it returns (kept as metrics). The reward model lives inside the reward fn
  (RM-Gallery's `reward_name` and its arguments in reward_fn_args), not in explorer.auxiliary_models.
- `math_ruler_workflow` / `async_math_ruler_workflow`: the first of explorer.auxiliary_models judges
  the whole group of answers in one call (RULER) and its scores, clipped to [0, 1], are the rewards.
  The task's reward fn (default `math_reward`) still scores each answer against the truth: its
  parts and their sum `gold_reward` are metrics only. `judge_success` is 1 when the judge's list
  was read, else 0 and every reward is 0 (Trinity's fallback).
- `math_trainable_ruler_workflow`: the policy judges its own answers and that judging is trained
  too. With probability 0.2 the truth is "available": the answers get their gold rewards, the
  policy judges the group repeat_times times, and each judgement is an experience of its own with
  reward 1 - mean|score - (gold + 0.1) / 1.2| (0 when unreadable), marked
  `info["task_id_suffix"] = "-ruler"`: the runner files it under task `<task>-ruler`, its own GRPO
  group (as Trinity).
  Otherwise the policy judges once and that judgement's scores are the rewards (0 when unreadable).

With the default reward fn and no format.system_prompt, the RULER workflows' policy is asked for
`<think>…</think><answer>…</answer>` (judging.THINK_ANSWER_SYSTEM_PROMPT). Differences from
Trinity, on purpose: the RULER prompt asks for as many scores as there are answers (Trinity's
math_ruler prompt says "solution n+1") and a list of another length is unreadable (Trinity's
math_ruler crashes on a short list). As in Trinity, the policy is always prompted through the chat
template (format.prompt_type is not read).
"""

from __future__ import annotations

import asyncio
import functools
import random
from typing import Any

from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.rewards.rm_gallery import RMGalleryReward
from services.explorer.workflows.base import Task
from services.explorer.workflows.judging import (
    THINK_ANSWER_SYSTEM_PROMPT,
    ask_judge,
    ask_judge_async,
    first_auxiliary_model,
    parse_score_list,
    ruler_messages,
)
from services.explorer.workflows.math import SimpleWorkflow

log = get_logger("explorer.judges")

__all__ = [
    "AsyncMathRMWorkflow",
    "AsyncMathRULERWorkflow",
    "MathRMWorkflow",
    "MathRULERWorkflow",
    "MathTrainableRULERWorkflow",
    "grade_ruler_replies",
]


def _reward_parts(value: Any) -> dict[str, float]:
    if isinstance(value, dict):
        return {str(k): float(v) for k, v in value.items()}
    return {"reward": float(value)}


class MathRMWorkflow(SimpleWorkflow):
    """`math_rm_workflow`: see the module docstring."""

    def reset(self, task: Task) -> None:
        self.task, self.format_args, self.rollout_args = task, task.format_args, task.rollout_args
        self.question, self.truth = task.task_desc, task.truth
        if self.question is None:
            raise KeyError(
                f"task {task.task_id!r} has no {task.format_args.prompt_key!r} column (format.prompt_key)"
            )
        spec = task.reward_fn if task.reward_fn is not None else RMGalleryReward
        args = dict(task.reward_fn_args)
        # Trinity's calling convention (positional experience and messages), so not resolve_reward's
        self.reward_fn = spec(**args) if isinstance(spec, type) else functools.partial(spec, **args)

    def score_by_model(self, exp: Experience, messages: list[dict[str, str]]) -> None:
        parts = _reward_parts(self.reward_fn(exp, messages, ground_truth=self.truth))
        exp.metrics.update(parts)
        # a `reward` part is the reward (OpenJudge's graders, as Trinity's math_openjudge_workflow);
        # otherwise the parts are summed (RM-Gallery's dimensions)
        exp.reward = float(parts["reward"] if "reward" in parts else sum(parts.values()))
        exp.info["truth"] = self.truth

    def run(self) -> list[Experience]:
        messages = self.format_messages()
        exps = self.model.chat(messages, **self.rollout_args.sampling())
        for exp in exps:
            self.score_by_model(exp, messages)
        return exps


class AsyncMathRMWorkflow(MathRMWorkflow):
    """`async_math_rm_workflow`: MathRMWorkflow on the event loop; the reward model runs in a thread."""

    is_async = True

    async def run_async(self) -> list[Experience]:
        messages = self.format_messages()
        exps = await self.model.chat_async(messages, **self.rollout_args.sampling())
        for exp in exps:
            await asyncio.to_thread(self.score_by_model, exp, messages)
        return exps


class _RULERBase(SimpleWorkflow):
    """What the RULER workflows share: the policy's prompt and the gold (truth-based) reward."""

    default_reward_fn = "math_reward"

    def reset(self, task: Task) -> None:
        super().reset(task)
        default_reward = task.reward_fn is None or task.reward_fn is REWARD_FUNCTIONS.get("math_reward")
        self.system_prompt = task.format_args.system_prompt
        if self.system_prompt is None and default_reward:
            self.system_prompt = THINK_ANSWER_SYSTEM_PROMPT

    def format_messages(self) -> list[dict[str, str]]:
        column = self.task.raw_task.get(self.format_args.system_prompt_key or "")
        system = column or self.system_prompt
        messages = [{"role": "system", "content": str(system)}] if system else []
        messages.append({"role": "user", "content": str(self.question)})
        return messages

    def score_gold(self, exps: list[Experience]) -> list[float]:
        """Each answer's reward fn parts and their sum `gold_reward` as metrics; returns the sums."""
        golds = []
        for exp in exps:
            parts = self.reward_fn(response=exp.response_text, truth=self.truth)
            gold = float(sum(parts.values()))
            exp.metrics.update(parts)
            exp.metrics["gold_reward"] = gold
            exp.info["truth"] = self.truth
            golds.append(gold)
        return golds

    def judge_messages(self, exps: list[Experience], *, spaced: bool = True) -> list[dict[str, str]]:
        return ruler_messages(str(self.question), [e.response_text for e in exps], spaced=spaced)


class MathRULERWorkflow(_RULERBase):
    """`math_ruler_workflow`: see the module docstring."""

    name = "math_ruler_workflow"

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.judge = first_auxiliary_model(self.name, self.auxiliary_models)

    def apply_ruler(self, exps: list[Experience], reply: str | None) -> None:
        """The judge's scores as rewards; all 0 and judge_success 0 when its reply is unreadable."""
        scores = parse_score_list(reply, len(exps))
        if scores is None:
            log.warning(
                "judge_reply_unreadable",
                workflow=self.name,
                task_id=self.task.task_id,
                reply=(reply or "")[-200:],
            )
        for exp, score in zip(exps, scores or [0.0] * len(exps), strict=True):
            exp.reward = score
            exp.metrics["judge_success"] = float(scores is not None)

    def run(self) -> list[Experience]:
        exps = self.model.chat(self.format_messages(), **self.rollout_args.sampling())
        self.score_gold(exps)
        self.apply_ruler(exps, ask_judge(self.judge, self.judge_messages(exps)))
        return exps


class AsyncMathRULERWorkflow(MathRULERWorkflow):
    """`async_math_ruler_workflow`: MathRULERWorkflow on the event loop; the judge is asked from a thread."""

    name = "async_math_ruler_workflow"
    is_async = True

    async def run_async(self) -> list[Experience]:
        exps = await self.model.chat_async(self.format_messages(), **self.rollout_args.sampling())
        self.score_gold(exps)
        self.apply_ruler(exps, await ask_judge_async(self.judge, self.judge_messages(exps)))
        return exps


def grade_ruler_replies(
    replies: list[str], count: int, targets: list[float] | None
) -> tuple[float, list[float], list[float]]:
    """Read the judge replies about `count` answers: (success rate, mean scores, judge rewards).

    The mean scores average the readable replies (all 0 when none is). With `targets` (the answers'
    scaled gold rewards) a readable reply earns 1 - mean|score - target|; every other reply earns 0.
    """
    totals = [0.0] * count
    readable = 0
    judge_rewards = []
    for reply in replies:
        scores = parse_score_list(reply, count)
        reward = 0.0
        if scores is not None:
            readable += 1
            totals = [t + s for t, s in zip(totals, scores, strict=True)]
            if targets:
                reward = 1.0 - sum(abs(s - t) for s, t in zip(scores, targets, strict=True)) / count
        judge_rewards.append(reward)
    rate = readable / len(replies) if replies else 0.0
    means = [t / readable for t in totals] if readable else totals
    return rate, means, judge_rewards


class MathTrainableRULERWorkflow(_RULERBase):
    """`math_trainable_ruler_workflow`: see the module docstring."""

    ground_truth_probability = 0.2
    """Chance that a task's truth is treated as available (Trinity's PROBABILITY_GROUND_TRUTH_AVAILABLE)."""

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.rng = random.Random()

    def run(self) -> list[Experience]:
        sampling = self.rollout_args.sampling()
        exps = self.model.chat(self.format_messages(), **sampling)
        golds = self.score_gold(exps)
        with_truth = self.rng.random() < self.ground_truth_probability
        if not with_truth:
            sampling["n"] = 1
        judgements = self.model.chat(self.judge_messages(exps, spaced=False), **sampling)
        targets = [(gold + 0.1) / 1.2 for gold in golds] if with_truth else None  # [-0.1, 1.1] -> [0, 1]
        rate, scores, judge_rewards = grade_ruler_replies(
            [j.response_text for j in judgements], len(exps), targets
        )
        if rate < 1.0:
            log.warning("judge_reply_unreadable", workflow="math_trainable_ruler_workflow", success=rate)
        for exp, gold, score in zip(exps, golds, scores, strict=True):
            exp.reward = gold if with_truth else score
            exp.metrics["judge_success"] = rate
        if not with_truth:
            return exps
        for judgement, reward in zip(judgements, judge_rewards, strict=True):
            judgement.reward = reward
            judgement.metrics.update({"judge_success": rate, "reward_for_judger": reward})
            judgement.info["task_id_suffix"] = "-ruler"
        return exps + judgements
