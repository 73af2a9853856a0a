"""The cod advantage, computed in the explorer's pipeline over one explorer step's experiences.

As Trinity-RFT's CoDAdvantageFn (an experience operator, compute_in_trainer False). With
iterative_hint_e2e_causal, each row is one episode step of a CoD run and its info carries what the
CoD workflow wrote (services/explorer/workflows/cod/pack.py): exp_type, task_idx or hint_idx,
task_rewards (the run's), taskset_id. Rows group by pack task (group id) and run (run id); the
numbers come from services/algorithms/advantage/cod.py. Without it, the advantages are step-wise
GRPO's over each run's last reward (pipeline/step_wise.py). Eval rows pass through.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from services.algorithms.advantage.cod import CodArgs, CodRow, cod_causal_scores
from services.algorithms.advantage.step_wise import check_std_cal_level
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.pipeline.operators import ExperienceOperator
from services.explorer.pipeline.step_wise import StepWiseGRPO

JUDGE_FLAGS = ("judge_format_error", "judge_format_error_in_trajectory")


def _mask(exp: Experience) -> np.ndarray:
    if exp.action_mask is not None and exp.action_mask.shape[0]:
        return exp.action_mask.astype(np.float32)
    return np.ones(exp.response_length, dtype=np.float32)


def _row(exp: Experience) -> CodRow:
    info = exp.info
    kind = info.get("exp_type")
    position = info.get("task_idx" if kind == "solve_task" else "hint_idx")
    if kind is None or position is None or "task_rewards" not in info:
        raise InvalidArgument(
            "advantage_fn cod with iterative_hint_e2e_causal needs rows from a CoD pack (info exp_type, "
            f"task_idx / hint_idx, task_rewards); task {exp.task_id!r} run {exp.run_id} has none: give the "
            "config a cod: section, or set iterative_hint_e2e_causal false",
            field="algorithm.advantage_fn",
        )
    return CodRow(
        task=exp.group_id or exp.task_id,
        run=exp.run_id,
        kind=str(kind),
        position=int(position),
        reward=float(exp.reward or 0.0),
        task_rewards=tuple(float(r) for r in info["task_rewards"]),
        response_tokens=int(_mask(exp).sum()),
        taskset=str(info.get("taskset_id", 0)),
    )


class CodAdvantage(ExperienceOperator):
    """CoD advantages over each explorer step's experiences (see the module docstring)."""

    def __init__(
        self,
        epsilon: float = 1e-6,
        enable_step_norm: bool = False,
        std_cal_level: str = "group",
        std_threshold: float | None = None,
        iterative_hint_e2e_causal: bool = False,
        mask_format_issue_exp: bool = False,  # deprecated in Trinity: no effect there either
        **causal: Any,
    ) -> None:
        check_std_cal_level(std_cal_level)
        unknown = sorted(set(causal) - set(CodArgs.__dataclass_fields__))
        if unknown:
            raise InvalidArgument(
                f"unknown argument(s) {unknown} of advantage_fn cod", field="algorithm.advantage_fn_args"
            )
        self.causal = iterative_hint_e2e_causal
        self.args = CodArgs(**causal)  # at start-up, not at the first step
        self.step_wise = StepWiseGRPO(epsilon, enable_step_norm, std_cal_level, std_threshold)
        # the adaptive temperature spans the whole step unless it is per task
        self.group_local = (
            self.step_wise.group_local if not self.causal else self.args.red_weight_adaptive_level == "task"
        )

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        if not self.causal:
            return self.step_wise.process(exps)
        train = [e for e in exps if not e.is_eval]
        if not train:
            return exps, {}
        kept = [e for e in train if not any(e.info.get(flag, False) for flag in JUDGE_FLAGS)]
        scores, returns, metrics = cod_causal_scores([_row(e) for e in kept], self.args)
        for exp, score, ret in zip(kept, scores, returns, strict=True):
            mask = _mask(exp)
            exp.advantages = (mask * score).astype(np.float32)
            exp.returns = (mask * ret).astype(np.float32)
        metrics["judge_format_error_count"] = float(len(train) - len(kept))
        metrics["advantage_mean"] = sum(scores) / len(scores) if scores else 0.0
        return kept + [e for e in exps if e.is_eval], metrics
