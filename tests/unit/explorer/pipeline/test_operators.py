"""Experience operators on hand-made groups, with hand-derived expected values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.common.config.monitor import OperatorConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.pipeline import EXPERIENCE_OPERATORS, ExperienceOperator, ExperiencePipeline


def exp(group, reward, response=2, **metrics):
    return Experience(
        tokens=np.arange(2 + response),
        prompt_length=2,
        model_version=0,
        reward=reward,
        group_id=group,
        metrics=dict(metrics),
    )


def rewards(exps):
    return [e.reward for e in exps]


def test_filters():
    exps = [
        exp("a", 1.0),
        exp("a", 0.0),
        exp("b", 0.5),
        exp("b", 0.5),
        exp("c", float("nan")),
        exp("c", None),
    ]
    kept, m = EXPERIENCE_OPERATORS.get("reward_filter")(threshold=0.5).process(list(exps))
    assert rewards(kept) == [1.0, 0.5, 0.5] and m == {"filtered_count": 3.0}
    kept, m = EXPERIENCE_OPERATORS.get("invalid_reward_filter")().process(list(exps))
    assert len(kept) == 4 and m["filtered_count"] == 2.0
    kept, m = EXPERIENCE_OPERATORS.get("reward_std_filter")().process(list(exps[:4]))
    # group a has rewards [1, 0] (std 0.5) and stays; group b [0.5, 0.5] (std 0) goes
    assert [e.group_id for e in kept] == ["a", "a"] and m == {"filtered_count": 2.0, "filtered_groups": 1.0}


def test_reward_shaping_mapper():
    op = EXPERIENCE_OPERATORS.get("reward_shaping_mapper")(
        reward_shaping_configs=[
            {"stats_key": "quality", "op_type": "ADD", "weight": 0.5},
            {"stats_key": "length_penalty", "op_type": "MUL", "weight": 2.0},
        ]
    )
    out, m = op.process([exp("a", 1.0, quality=0.4, length_penalty=0.25), exp("a", 1.0)])
    # (1 + 0.5 * 0.4) * (2 * 0.25) = 1.2 * 0.5 = 0.6; the second has no stats and stays 1.0
    assert rewards(out) == pytest.approx([0.6, 1.0]) and m == {"shaped_count": 2.0}
    with pytest.raises(InvalidArgument, match="op_type"):
        EXPERIENCE_OPERATORS.get("reward_shaping_mapper")(
            reward_shaping_configs=[{"stats_key": "q", "op_type": "POW"}]
        )


def test_group_advantage_is_grpo():
    out, _ = EXPERIENCE_OPERATORS.get("group_advantage")().process(
        [exp("g", 1.0, 3), exp("g", 0.0, 1), exp("g", 0.0, 2), exp("h", 2.0)]
    )
    # group g: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.57735
    expected = (1 - 1 / 3) / (math.sqrt(1 / 3) + 1e-6)
    np.testing.assert_allclose(out[0].advantages, [expected] * 3, rtol=1e-6)
    np.testing.assert_allclose(out[1].advantages, [-expected / 2], rtol=1e-6)
    # a group of one: mean 0, std 1, as the trainer's grpo fn -> 2 / (1 + 1e-6)
    np.testing.assert_allclose(out[3].advantages, [2.0 / (1 + 1e-6)] * 2, rtol=1e-6)


def test_group_advantage_agrees_with_the_trainers_grpo_fn():
    import torch

    from services.algorithms.advantage.grpo import grpo_advantages

    exps = [exp("g", 1.0), exp("g", 0.0), exp("g", 0.5), exp("h", 2.0), exp("k", 1.0), exp("k", 1.0)]
    out, _ = EXPERIENCE_OPERATORS.get("group_advantage")().process(exps)
    trainer_side, _, _ = grpo_advantages(
        torch.tensor([1.0, 0.0, 0.5, 2.0, 1.0, 1.0]), torch.ones(6, 1), torch.tensor([0, 0, 0, 1, 2, 2])
    )
    np.testing.assert_allclose([e.advantages[0] for e in out], trainer_side[:, 0].numpy(), rtol=1e-5)


class Doubler(ExperienceOperator):
    def __init__(self, factor: float = 2.0) -> None:
        self.factor = factor

    def process(self, exps):
        for e in exps:
            e.reward *= self.factor
        return exps, {"doubled": float(len(exps))}


def test_pipeline_from_config_in_order_with_user_operator_by_dotted_path():
    pipeline = ExperiencePipeline.from_config(
        [
            OperatorConfig(name="tests.unit.explorer.pipeline.test_operators.Doubler", args={"factor": 3.0}),
            OperatorConfig(name="reward_filter", args={"threshold": 2.0}),
        ]
    )
    out, metrics = pipeline.process([exp("a", 1.0), exp("a", 0.5)])
    assert rewards(out) == [3.0]
    assert metrics == {"pipeline/0_Doubler/doubled": 2.0, "pipeline/1_reward_filter/filtered_count": 1.0}
    with pytest.raises(InvalidArgument) as info:
        ExperiencePipeline.from_config([OperatorConfig(name="reward_filter", args={"treshold": 1})])
    assert info.value.field == "data_processor.experience_pipeline.operators[0].args"
    with pytest.raises(InvalidArgument, match="unknown experience operator 'nope'"):
        ExperiencePipeline.from_config([OperatorConfig(name="nope")])


def test_pass_rate_calculator_measures_and_keeps_every_experience():
    # tasks: a 2 of 4 solved (0.5), b 0 of 2 (0.0), c 2 of 2 via the accuracy metric (1.0, its
    # rewards are 0.1: accuracy wins over reward > 0), d 1 of 2 where accuracy -1 counts as 0 (0.5).
    rows = [exp("a", r) for r in (1.0, 0.0, 1.0, 0.0)] + [exp("b", 0.0), exp("b", 0.0)]
    rows += [exp("c", 0.1, accuracy=1.0), exp("c", 0.1, accuracy=1.0)]
    rows += [exp("d", 1.0, accuracy=1.0), exp("d", -1.0, accuracy=-1.0)]
    for row in rows:
        row.task_id = row.group_id
    kept, metrics = EXPERIENCE_OPERATORS.get("pass_rate_calculator")().process(rows)
    assert kept == rows
    assert metrics == {
        "tasks": 4.0,
        "pass_rate_mean": pytest.approx((0.5 + 0.0 + 1.0 + 0.5) / 4),
        "valid_ratio": 0.5,  # a and d
        "all_pass_ratio": 0.25,  # c
        "all_fail_ratio": 0.25,  # b
    }


def test_data_juicer_is_registered_and_refused_with_the_reason():
    with pytest.raises(InvalidArgument, match="Data-Juicer service") as err:
        ExperiencePipeline.from_config([OperatorConfig(name="data_juicer", args={"config_path": "dj.yaml"})])
    assert err.value.field == "data_processor.experience_pipeline.operators"
