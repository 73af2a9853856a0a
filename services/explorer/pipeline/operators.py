"""Experience operators (Trinity's data_processor.experience_pipeline): `process(exps) -> (exps, metrics)`.

Applied in order to each explorer step's experiences before they are written. Built-ins:
reward_filter, reward_std_filter, invalid_reward_filter, reward_shaping_mapper, group_advantage
(GRPO-style advantages computed here, for when the algorithm wants the explorer to do it), and
DAPO's dapo_dynamic_sampling and mask_response_truncated (dapo.py). User operators register with
`@EXPERIENCE_OPERATORS.register_module("name")` or are named by dotted path.

The pipeline counts what each operator drops, by reason, for summary.json's `experiences.dropped`:
an operator's metrics named `dropped_<reason>` (experiences) name part of its drops
(`<operator>/<reason>`, e.g. `dapo_dynamic_sampling/all_wrong`); the rest is filed under the
operator's name.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.common.registry import Registry

EXPERIENCE_OPERATORS = Registry(
    "experience operator",
    {
        "reward_filter": "services.explorer.pipeline.operators:RewardFilter",
        "reward_std_filter": "services.explorer.pipeline.operators:RewardSTDFilter",
        "invalid_reward_filter": "services.explorer.pipeline.operators:InvalidRewardFilter",
        "reward_shaping_mapper": "services.explorer.pipeline.operators:RewardShapingMapper",
        "group_advantage": "services.explorer.pipeline.operators:GroupAdvantage",
        "grpo_advantage": "services.explorer.pipeline.operators:GroupAdvantage",
        "pass_rate_calculator": "services.explorer.pipeline.operators:PassRateCalculator",
        "step_wise_grpo": "services.explorer.pipeline.step_wise:StepWiseGRPO",
        "data_juicer": "services.explorer.pipeline.operators:DataJuicerOperator",
        "dapo_dynamic_sampling": "services.explorer.pipeline.dapo:DAPODynamicSampling",
        "mask_response_truncated": "services.explorer.pipeline.dapo:MaskResponseTruncated",
    },
    config_key="data_processor.experience_pipeline.operators",
    plugin_hint="a module in explorer.plugin_dirs that registers it",
)


class ExperienceOperator(ABC):
    """One step of the pipeline."""

    refill: ClassVar[bool] = False
    """True for dynamic sampling: the explorer reads further tasks within the step to replace the
    groups the pipeline drops (explorer.max_num_gen_batches; services/explorer/refill.py)."""

    group_local: bool = False
    """True when the operator's output for a group depends on that group's experiences alone (a
    per-experience or per-group operator): the explorer then runs the pipeline on each group as
    soon as it is complete and writes it at once (services/explorer/writes.py). False (the default,
    so a user operator that looks at the whole step keeps seeing it): the explorer runs the pipeline
    once per batch of tasks, after the last group, and writes then."""

    @abstractmethod
    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        """Transform the experiences of one explorer step; return them with metrics for logging."""


def group_by_id(exps: list[Experience]) -> dict[str, list[Experience]]:
    groups: dict[str, list[Experience]] = defaultdict(list)
    for exp in exps:
        groups[exp.group_id or exp.task_id].append(exp)
    return groups


class RewardFilter(ExperienceOperator):
    """Keep experiences whose reward is >= threshold."""

    group_local = True

    def __init__(self, threshold: float = 0.0) -> None:
        self.threshold = threshold

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        kept = [e for e in exps if e.reward is not None and e.reward >= self.threshold]
        return kept, {"filtered_count": float(len(exps) - len(kept))}


class RewardSTDFilter(ExperienceOperator):
    """Drop whole groups whose reward std is <= threshold (equal rewards carry no GRPO signal)."""

    group_local = True

    def __init__(self, threshold: float = 0.0) -> None:
        self.threshold = threshold

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        kept: list[Experience] = []
        dropped_groups = 0
        for group in group_by_id(exps).values():
            rewards = np.array([e.reward or 0.0 for e in group], dtype=np.float64)
            if rewards.std() > self.threshold:
                kept.extend(group)
            else:
                dropped_groups += 1
        return kept, {
            "filtered_count": float(len(exps) - len(kept)),
            "filtered_groups": float(dropped_groups),
        }


class InvalidRewardFilter(ExperienceOperator):
    """Drop experiences whose reward is missing, NaN or infinite."""

    group_local = True

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        kept = [e for e in exps if e.reward is not None and math.isfinite(e.reward)]
        return kept, {"filtered_count": float(len(exps) - len(kept))}


class PassRateCalculator(ExperienceOperator):
    """Trinity's pass_rate_calculator: the step's per-task pass rates as metrics, experiences unchanged.

    In Trinity this operator is what feeds the difficulty_based (BOTS) selector; here the explorer
    reports every task's pass rate to that selector itself after each step (the same rule: the
    `accuracy` metric when the workflow gives one, else the share of rewards > 0), so the operator
    only measures: tasks, mean pass rate, and the shares of tasks all solved, all failed, and in
    between (`valid_ratio`: the tasks whose group carries a learning signal).
    """

    group_local = True

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        rates = []
        for task_exps in _by_task(exps).values():
            outcomes = [
                max(0.0, float(e.metrics["accuracy"]))
                if "accuracy" in e.metrics
                else float((e.reward or 0.0) > 0)
                for e in task_exps
            ]
            rates.append(float(np.mean(outcomes)))
        if not rates:
            return exps, {"tasks": 0.0}
        arr = np.array(rates)
        return exps, {
            "tasks": float(arr.size),
            "pass_rate_mean": float(arr.mean()),
            "valid_ratio": float(((arr > 0) & (arr < 1)).mean()),
            "all_pass_ratio": float((arr == 1).mean()),
            "all_fail_ratio": float((arr == 0).mean()),
        }


def _by_task(exps: list[Experience]) -> dict[str, list[Experience]]:
    tasks: dict[str, list[Experience]] = defaultdict(list)
    for exp in exps:
        tasks[exp.task_id or exp.group_id].append(exp)
    return tasks


_OPS = {
    "ADD": lambda r, v, w: r + w * v,
    "SUB": lambda r, v, w: r - w * v,
    "MUL": lambda r, v, w: r * (w * v),
    "DIV": lambda r, v, w: r / (w * v),
}


class RewardShapingMapper(ExperienceOperator):
    """Adjust the reward with named statistics of the experience (Trinity's reward_shaping_mapper).

    reward_shaping_configs: [{"stats_key": "quality", "op_type": "ADD", "weight": 0.5}, ...]: the
    value is looked up in exp.metrics, then exp.info; an experience without it is left unchanged.
    """

    group_local = True

    def __init__(self, reward_shaping_configs: list[dict[str, Any]] | None = None) -> None:
        self.configs = reward_shaping_configs or []
        for i, cfg in enumerate(self.configs):
            if cfg.get("op_type", "ADD") not in _OPS:
                raise InvalidArgument(
                    f"op_type must be one of {sorted(_OPS)}", field=f"reward_shaping_configs[{i}].op_type"
                )
            if "stats_key" not in cfg:
                raise InvalidArgument("stats_key is required", field=f"reward_shaping_configs[{i}].stats_key")

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        shaped = 0
        for exp in exps:
            for cfg in self.configs:
                key = cfg["stats_key"]
                value = exp.metrics.get(key, exp.info.get(key))
                if value is None or exp.reward is None:
                    continue
                exp.reward = float(
                    _OPS[cfg.get("op_type", "ADD")](exp.reward, float(value), float(cfg.get("weight", 1.0)))
                )
                shaped += 1
        return exps, {"shaped_count": float(shaped)}


class GroupAdvantage(ExperienceOperator):
    """GRPO advantages per group: (r - mean) / (std + epsilon), broadcast over the response tokens.

    std_normalize false gives Dr. GRPO's r - mean. Groups are the experiences sharing a group id.
    A group of one has mean 0 and std 1, as the trainer's `grpo` advantage fn (and Trinity's):
    the row keeps its raw reward as advantage instead of a silent 0.
    """

    group_local = True

    def __init__(self, epsilon: float = 1e-6, std_normalize: bool = True) -> None:
        self.epsilon = epsilon
        self.std_normalize = std_normalize

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        values = []
        for group in group_by_id(exps).values():
            rewards = np.array([e.reward or 0.0 for e in group], dtype=np.float64)
            single = len(rewards) == 1
            adv = rewards - (0.0 if single else rewards.mean())
            if self.std_normalize:
                adv = adv / ((1.0 if single else rewards.std(ddof=1)) + self.epsilon)
            for exp, a in zip(group, adv, strict=True):
                exp.advantages = np.full(exp.response_length, a, dtype=np.float32)
                exp.returns = exp.advantages.copy()
                values.append(a)
        return exps, {"advantage_mean": float(np.mean(values)) if values else 0.0}


class DataJuicerOperator(ExperienceOperator):
    """Trinity's `data_juicer` operator sends each step's experiences to a Data-Juicer service
    (`service.data_juicer`), which this project does not run: refused when the pipeline is built,
    so `trinity config check` names it before anything starts."""

    def __init__(self, **kwargs: Any) -> None:
        raise InvalidArgument(
            "the data_juicer experience operator needs Trinity's Data-Juicer service (service.data_juicer), "
            "which trinity-grpc does not provide; use the built-in operators (reward_filter, "
            "reward_std_filter, invalid_reward_filter, reward_shaping_mapper) or register your own "
            "operator (explorer.plugin_dirs) that calls Data-Juicer",
            field="data_processor.experience_pipeline.operators",
        )

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        raise NotImplementedError  # never constructed


@dataclass
class PipelineOutput:
    """What the pipeline made of one batch of experiences."""

    experiences: list[Experience]
    metrics: dict[str, float]
    dropped: Counter[str] = field(default_factory=Counter)
    """Experiences the operators removed, by reason (see the module docstring)."""


def drop_reasons(name: str, lost: int, metrics: dict[str, float]) -> Counter[str]:
    """`lost` experiences that operator `name` removed, split by its `dropped_<reason>` metrics."""
    short = name.rsplit(".", 1)[-1].rsplit(":", 1)[-1]
    out: Counter[str] = Counter()
    if lost <= 0:
        return out
    for key, value in metrics.items():
        if key.startswith("dropped_") and value > 0:
            out[f"{short}/{key.removeprefix('dropped_')}"] += int(value)
    if lost > sum(out.values()):
        out[short] += lost - sum(out.values())
    return out


class ExperiencePipeline:
    """The configured operators, in order; metrics come back as `pipeline/<i>_<name>/<metric>`."""

    def __init__(self, operators: list[tuple[str, ExperienceOperator]]) -> None:
        self.operators = operators

    @property
    def refills(self) -> bool:
        """Whether an operator asks for dynamic sampling's refill (ExperienceOperator.refill)."""
        return any(op.refill for _, op in self.operators)

    @property
    def batch_level(self) -> list[str]:
        """The operators that must see a whole batch of tasks (not ExperienceOperator.group_local)."""
        return [name for name, op in self.operators if not op.group_local]

    @classmethod
    def from_config(cls, specs: list[Any]) -> ExperiencePipeline:
        ops = []
        for i, spec in enumerate(specs):
            factory = EXPERIENCE_OPERATORS.get(
                spec.name, field=f"data_processor.experience_pipeline.operators[{i}].name"
            )
            try:
                ops.append((spec.name, factory(**spec.args)))
            except TypeError as exc:
                raise InvalidArgument(
                    str(exc), field=f"data_processor.experience_pipeline.operators[{i}].args"
                ) from exc
        return cls(ops)

    def run(self, exps: list[Experience]) -> PipelineOutput:
        out = PipelineOutput(exps, {})
        for i, (name, op) in enumerate(self.operators):
            before = len(out.experiences)
            out.experiences, op_metrics = op.process(out.experiences)
            out.dropped.update(drop_reasons(name, before - len(out.experiences), op_metrics))
            for key, value in op_metrics.items():
                out.metrics[f"pipeline/{i}_{name.rsplit('.', 1)[-1]}/{key}"] = float(value)
        return out

    def process(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        out = self.run(exps)
        return out.experiences, out.metrics
