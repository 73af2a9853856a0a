"""multi_step_grpo's advantages, computed where a step's runs are all present: the explorer's pipeline.

Trinity-RFT computes step_wise_grpo outside the trainer (an experience operator), because a run's
steps and a task's runs are only guaranteed to be together in the explorer step that produced them;
a trainer batch may cut a run in two. The explorer appends this operator to the pipeline when the
resolved algorithm's advantage_fn is `step_wise_grpo` (or `gigpo`: pipeline/gigpo.py, `cod`: pipeline/cod.py), with
`algorithm.advantage_fn_args`.

Rows are grouped by task (group id: one task in one explorer step) and run (run id); the last step
of a run is the one with the highest `step` (ties: the later row). The numbers come from
services/algorithms/advantage/step_wise.py (one implementation for both services). Runs of
tasks that std_threshold skips are dropped, as Trinity does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from services.algorithms.advantage.step_wise import check_std_cal_level, step_wise_grpo_scores
from services.common.config.schema import TrinityConfig
from services.common.experience import Experience
from services.explorer.pipeline.gigpo import GiGPO
from services.explorer.pipeline.operators import ExperienceOperator


class StepWiseGRPO(ExperienceOperator):
    """Step-wise GRPO advantages over each explorer step's experiences (see the module docstring)."""

    def __init__(
        self,
        epsilon: float = 1e-6,
        enable_step_norm: bool = False,
        std_cal_level: str = "group",
        std_threshold: float | None = None,
    ) -> None:
        check_std_cal_level(std_cal_level)  # at start-up, not at the first step
        # "batch" normalizes by the std over the whole step: the pipeline must see every group
        self.group_local = std_cal_level != "batch"
        self.args: dict[str, Any] = {
            "epsilon": epsilon,
            "enable_step_norm": enable_step_norm,
            "std_cal_level": std_cal_level,
            "std_threshold": std_threshold,
        }

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        train = [e for e in exps if not e.is_eval]
        if not train:
            return exps, {}
        tasks: dict[str, int] = {}
        runs: dict[tuple[str, int], int] = {}
        task_index, run_index, step_index = [], [], []
        for row, exp in enumerate(train):
            task = exp.group_id or exp.task_id
            task_index.append(tasks.setdefault(task, len(tasks)))
            run_index.append(runs.setdefault((task, exp.run_id), len(runs)))
            # ties on `step` resolve to the later row: steps are scaled so the row order breaks them
            step_index.append(exp.step * (len(train) + 1) + row)
        scores, keep = step_wise_grpo_scores(
            torch.tensor([float(e.reward or 0.0) for e in train]),
            torch.tensor(task_index),
            torch.tensor(run_index),
            torch.tensor(step_index),
            **self.args,
        )
        kept: list[Experience] = []
        for exp, score, ok in zip(train, scores.tolist(), keep.tolist(), strict=True):
            if not ok:
                continue
            mask = (
                exp.action_mask.astype(np.float32)
                if exp.action_mask is not None and exp.action_mask.shape[0]
                else np.ones(exp.response_length, dtype=np.float32)
            )
            exp.advantages = (mask * score).astype(np.float32)
            exp.returns = exp.advantages.copy()
            kept.append(exp)
        dropped = len(train) - len(kept)
        metrics = {
            "experience_count": float(len(kept)),
            "filtered_count": float(dropped),
            "runs": float(len(runs)),
            "steps_per_run": len(train) / max(len(runs), 1),
            "advantage_mean": float(scores[keep].mean()) if bool(keep.any()) else 0.0,
        }
        return kept + [e for e in exps if e.is_eval], metrics


def explorer_side_advantage(cfg: TrinityConfig) -> tuple[str, ExperienceOperator] | None:
    """The advantage operator the explorer must run for `cfg.algorithm`, if its advantage fn lives here."""
    algorithm = cfg.algorithm
    args = algorithm.advantage_fn_args or {}
    if algorithm.advantage_fn == "step_wise_grpo":
        return "step_wise_grpo", StepWiseGRPO(**args)
    if algorithm.advantage_fn == "gigpo":
        return "gigpo", GiGPO(**args)
    if algorithm.advantage_fn == "cod":
        from services.explorer.pipeline.cod import CodAdvantage  # it imports this module

        return "cod", CodAdvantage(**args)
    return None
