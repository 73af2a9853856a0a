"""An explorer step's metrics from its rollouts: rewards, lengths, speed, failures, pass rates."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.common.experience import Experience
from services.explorer.prompt_fit import PROMPT_TRUNCATED
from services.explorer.refill import RolloutRow
from services.explorer.runner import UnitResult


def rollout_metrics(
    results: list[UnitResult], exps: Sequence[Experience | RolloutRow], seconds: float
) -> dict[str, float]:
    """Step metrics before the pipeline: rewards, lengths, tokens/s, task times, failures."""
    rewards = np.array([e.reward for e in exps if e.reward is not None], dtype=np.float64)
    lengths = np.array([e.response_length for e in exps], dtype=np.float64)
    times = np.array([r.seconds for r in results], dtype=np.float64)
    metrics = {
        "rollout/experiences": float(len(exps)),
        "rollout/reward/mean": float(rewards.mean()) if rewards.size else 0.0,
        "rollout/reward/std": float(rewards.std()) if rewards.size else 0.0,
        "rollout/reward/max": float(rewards.max()) if rewards.size else 0.0,
        "rollout/reward/min": float(rewards.min()) if rewards.size else 0.0,
        "rollout/response_length/mean": float(lengths.mean()) if lengths.size else 0.0,
        "rollout/response_length/max": float(lengths.max()) if lengths.size else 0.0,
        "rollout/tokens_per_s": float(lengths.sum() / seconds) if seconds > 0 else 0.0,
        "rollout/task_time/mean": float(times.mean()) if times.size else 0.0,
        "rollout/task_time/max": float(times.max()) if times.size else 0.0,
        "rollout/timeouts": float(sum(r.timeouts for r in results)),
        "rollout/retries": float(sum(r.retries for r in results)),
        "rollout/skipped": float(sum(r.skipped for r in results)),
        # prompts past model.max_prompt_tokens, and those masked out for it (explorer/prompt_fit.py)
        "rollout/prompt_overlong": float(sum(1 for e in exps if e.info.get("prompt_overlong"))),
        "rollout/prompt_masked": float(
            sum(1 for e in exps if e.info.get("truncate_status") == PROMPT_TRUNCATED)
        ),
        "time/rollout_s": seconds,
    }
    names = {name for e in exps for name in e.metrics}
    for name in sorted(names):
        values = [e.metrics[name] for e in exps if name in e.metrics]
        metrics[f"rollout/{name}/mean"] = float(np.mean(values))
    return metrics


def pass_rates(results: list[UnitResult]) -> dict[str, float]:
    """Per task: mean `accuracy` metric when the workflow reports one, else the share of rewards > 0.

    An accuracy below 0 counts as 0: math_dapo_reward reports -1 for a wrong answer (DAPO's rule).
    """
    outcomes: dict[str, list[float]] = {}
    for result in results:
        bucket = outcomes.setdefault(result.task.task_id, [])
        bucket.extend(
            max(0.0, float(e.metrics["accuracy"]))
            if "accuracy" in e.metrics
            else float((e.reward or 0.0) > 0)
            for e in result.experiences
        )
        if result.skipped:
            bucket.append(0.0)
    return {task_id: float(np.mean(v)) for task_id, v in outcomes.items() if v}
