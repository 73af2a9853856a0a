"""gigpo's advantages, computed in the explorer's pipeline over one explorer step's experiences.

As Trinity-RFT's GiGPOAdvantageFn (an experience operator, compute_in_trainer False): the step's
rows are grouped by task (group id) and run (run id), ordered by `step` (ties keep row order),
and each row's step reward r_t is `info[step_reward_key]` when any row of its run has that key
(missing on a row: 0), else the run's sparse reward: the last row's `reward`, 0 on the other rows
(a RewardPropagationWorkflow gives every row the run's reward; only the last counts). The anchor
key is `str(info[env_state_hash_key])`; step_wise_alfworld_workflow sets both keys. Anchor groups
span the whole step, so the operator is not group-local (the pipeline sees every group of the
step before writing). Numbers: services/algorithms/advantage/gigpo.py. Eval rows pass through.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from services.algorithms.advantage.gigpo import check_fnorm, gigpo_scores
from services.common.experience import Experience
from services.explorer.pipeline.operators import ExperienceOperator


def _step_rewards(train: list[Experience], runs: list[int], order: list[int], key: str) -> list[float]:
    rewards = [0.0] * len(train)
    dense = {run for run, exp in zip(runs, train, strict=True) if key in exp.info}
    last: dict[int, int] = {}
    for row, run in enumerate(runs):
        if run in dense:
            rewards[row] = float(train[row].info.get(key, 0.0))
        elif run not in last or order[row] >= order[last[run]]:
            last[run] = row
    for row in last.values():
        rewards[row] = float(train[row].reward or 0.0)
    return rewards


class GiGPO(ExperienceOperator):
    """GiGPO advantages over each explorer step's experiences (see the module docstring)."""

    group_local = False  # anchor groups cross tasks

    def __init__(
        self,
        omega: float = 1.0,
        gamma: float = 1.0,
        fnorm: str = "none",
        epsilon: float = 1e-6,
        step_reward_key: str = "step_reward",
        env_state_hash_key: str = "env_state_hash",
    ) -> None:
        check_fnorm(fnorm)  # at start-up, not at the first step
        self.step_reward_key = step_reward_key
        self.env_state_hash_key = env_state_hash_key
        self.args: dict[str, Any] = {"omega": omega, "gamma": gamma, "fnorm": fnorm, "epsilon": epsilon}

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        train = [e for e in exps if not e.is_eval]
        if not train:
            return exps, {}
        tasks: dict[str, int] = {}
        runs: dict[tuple[str, int], int] = {}
        task_index, run_index = [], []
        for exp in train:
            task = exp.group_id or exp.task_id
            task_index.append(tasks.setdefault(task, len(tasks)))
            run_index.append(runs.setdefault((task, exp.run_id), len(runs)))
        # ties on `step` keep row order: steps are scaled so the row index breaks them
        order = [exp.step * (len(train) + 1) + row for row, exp in enumerate(train)]
        keys = [
            None if e.info.get(self.env_state_hash_key) is None else str(e.info[self.env_state_hash_key])
            for e in train
        ]
        rewards = _step_rewards(train, run_index, order, self.step_reward_key)
        scores, metrics = gigpo_scores(rewards, task_index, run_index, order, keys, **self.args)
        for exp, score in zip(train, scores.tolist(), strict=True):
            mask = (
                exp.action_mask.astype(np.float32)
                if exp.action_mask is not None and exp.action_mask.shape[0]
                else np.ones(exp.response_length, dtype=np.float32)
            )
            exp.advantages = (mask * score).astype(np.float32)
            exp.returns = exp.advantages.copy()
        metrics = {
            **metrics,
            "experience_count": float(len(train)),
            "runs": float(len(runs)),
            "advantage_mean": float(torch.as_tensor(scores).mean()),
        }
        return exps, metrics
