"""DAPO's two experience operators (arXiv:2503.14476), with Trinity-RFT v0.6's names and rules.

- `dapo_dynamic_sampling` (Sec. 3.2, dynamic sampling): keep a group only when some but not all
  of its rollouts are correct, 0 < |correct| < G. Correct means the outcome score is above
  `correct_threshold` (0.0); the score is the experience's `metric_key` metric (`accuracy`, which
  math_dapo_reward reports as +1 / -1), or its reward when the workflow reports no such metric, so
  an overlong penalty that makes the rewards of an all-correct group differ keeps nothing alive.
  A group of a single rollout carries no comparison and is dropped too (Trinity's
  `len(group) < 2`); its experiences count in `filtered_count` but in neither `dropped_all_*`.
  `criterion: std` (ours; veRL's `algorithm.filter_groups`, which keeps a group when its metric's std
  is above 0) keeps a group whenever its scores are not all equal, so a shaped reward whose levels are
  all above `correct_threshold` (1 boxed right, 0.5 unboxed right) still teaches the difference; a
  dropped group counts as all correct when its one score is above the threshold, else all wrong.
  Metrics (experiences, as Trinity's): `filtered_count`, `dropped_all_correct`,
  `dropped_all_wrong`. It is a refilling operator (`refill = True`): the explorer reads further
  task batches within the step to replace the groups it drops (services/explorer/refill.py).
- `mask_response_truncated` (Sec. 3.4, overlong filtering): a response cut by the length limit
  keeps its row but gets an all-zero action mask, so it adds nothing to the policy gradient.
  Trinity's rule is `truncate_status == "response_truncated"`; here a workflow files that status
  in `info["truncate_status"]` (frozen_lake does), and a reply the engine stopped at max_tokens
  says so in `info["finish_reason"] == "length"`, which counts as truncated too. Metric:
  `masked_truncated_count`.

Trinity's source: trinity/buffer/operators/filters/reward_filter.py (DAPODynamicSamplingFilter,
MaskResponseTruncatedOperator) and trinity/algorithm/algorithm.py (DAPOAlgorithm).
"""

from __future__ import annotations

import numpy as np

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.pipeline.operators import ExperienceOperator, group_by_id

RESPONSE_TRUNCATED = "response_truncated"


class DAPODynamicSampling(ExperienceOperator):
    """Drop the groups whose rollouts are all correct or all wrong (see the module docstring)."""

    group_local = True

    refill = True

    def __init__(
        self, metric_key: str = "accuracy", correct_threshold: float = 0.0, criterion: str = "correctness"
    ) -> None:
        if criterion not in ("correctness", "std"):
            raise InvalidArgument(
                f"dapo_dynamic_sampling: criterion must be correctness (Trinity's: some but not all correct) "
                f"or std (veRL's filter_groups: scores not all equal), got {criterion!r}",
                field="data_processor.experience_pipeline.operators",
            )
        self.metric_key = metric_key
        self.correct_threshold = correct_threshold
        self.criterion = criterion

    def outcome(self, exp: Experience) -> float:
        """The score correctness is judged on: the `metric_key` metric, else the reward."""
        if self.metric_key in exp.metrics:
            return float(exp.metrics[self.metric_key])
        if exp.reward is not None:
            return float(exp.reward)
        raise InvalidArgument(
            f"dapo_dynamic_sampling: experience of task {exp.task_id!r} has no {self.metric_key!r} "
            "metric and no reward; put invalid_reward_filter before it or set metric_key",
            field="data_processor.experience_pipeline.operators",
        )

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        kept: list[Experience] = []
        all_correct = all_wrong = 0
        for group in group_by_id(exps).values():
            if len(group) < 2:
                continue
            scores = [self.outcome(e) for e in group]
            if self.criterion == "std" and max(scores) != min(scores):
                kept.extend(group)
                continue
            correct = sum(score > self.correct_threshold for score in scores)  # all equal under std: 0 or all
            if correct == 0:
                all_wrong += len(group)
            elif correct == len(group):
                all_correct += len(group)
            else:
                kept.extend(group)
        return kept, {
            "filtered_count": float(len(exps) - len(kept)),
            "dropped_all_correct": float(all_correct),
            "dropped_all_wrong": float(all_wrong),
        }


def is_response_truncated(exp: Experience) -> bool:
    """Trinity's truncate_status, or the engine's finish_reason "length" (the reply hit max_tokens)."""
    return exp.info.get("truncate_status") == RESPONSE_TRUNCATED or exp.info.get("finish_reason") == "length"


class MaskResponseTruncated(ExperienceOperator):
    """Zero the action mask of every truncated response (see the module docstring)."""

    group_local = True

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        masked = 0
        for exp in exps:
            if is_response_truncated(exp):
                exp.action_mask = np.zeros(exp.response_length, dtype=bool)
                masked += 1
        return exps, {"masked_truncated_count": float(masked)}
