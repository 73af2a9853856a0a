"""DAPO's operators on hand-worked groups: which groups drop (and why), which responses get masked,
and how the pipeline counts the drops by reason."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.config.monitor import OperatorConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.pipeline import EXPERIENCE_OPERATORS, ExperiencePipeline


def exp(group, reward=None, response=3, info=None, **metrics):
    return Experience(
        tokens=np.arange(2 + response),
        prompt_length=2,
        model_version=0,
        reward=reward,
        group_id=group,
        metrics=dict(metrics),
        info=dict(info or {}),
    )


def dynamic_sampling(**args):
    return EXPERIENCE_OPERATORS.get("dapo_dynamic_sampling")(**args)


def test_dynamic_sampling_keeps_only_groups_with_some_right_and_some_wrong():
    exps = [
        # a: accuracy +1, -1, +1 -> 2 of 3 correct: kept
        exp("a", 0.9, accuracy=1.0),
        exp("a", -1.0, accuracy=-1.0),
        exp("a", 0.5, accuracy=1.0),
        # b: all correct, but the overlong penalty made the rewards differ (1.0 vs 0.5): dropped,
        # correctness is judged on `accuracy`, not on the shaped reward
        exp("b", 1.0, accuracy=1.0),
        exp("b", 0.5, accuracy=1.0),
        # c: all wrong (-1 > 0 is false) -> dropped
        *[exp("c", -1.0, accuracy=-1.0) for _ in range(4)],
        # d: one rollout -> no comparison, dropped in neither dropped_all_* count
        exp("d", 1.0, accuracy=1.0),
        # e: no accuracy metric: the reward decides; 0.0 is not > 0 -> one right of two: kept
        exp("e", 0.0),
        exp("e", 0.3),
    ]
    kept, metrics = dynamic_sampling().process(list(exps))
    assert [e.group_id for e in kept] == ["a", "a", "a", "e", "e"]
    assert metrics == {"filtered_count": 7.0, "dropped_all_correct": 2.0, "dropped_all_wrong": 4.0}


def test_dynamic_sampling_threshold_and_metric_key():
    exps = [exp("a", 0.4, score=0.4), exp("a", 0.6, score=0.6)]
    # correct means score > correct_threshold: at 0.5 one of two is right
    kept, _ = dynamic_sampling(metric_key="score", correct_threshold=0.5).process(list(exps))
    assert len(kept) == 2
    kept, metrics = dynamic_sampling(metric_key="score", correct_threshold=0.7).process(list(exps))
    assert kept == [] and metrics["dropped_all_wrong"] == 2.0
    with pytest.raises(InvalidArgument, match="no 'accuracy' metric and no reward"):
        dynamic_sampling().process([exp("x"), exp("x")])


def test_mask_response_truncated_zeroes_the_mask_of_replies_cut_at_the_limit():
    op = EXPERIENCE_OPERATORS.get("mask_response_truncated")()
    exps = [
        exp("a", 1.0, info={"finish_reason": "length"}),  # the engine stopped it at max_tokens
        exp("a", 1.0, info={"finish_reason": "stop"}),
        exp("b", 0.0, response=4, info={"truncate_status": "response_truncated"}),  # a workflow said so
        exp("b", 0.0, info={"truncate_status": "prompt_truncated"}),  # not a response truncation
        exp("c", 0.0),  # no finish reason recorded
    ]
    exps[1].action_mask = np.array([True, False, True])
    out, metrics = op.process(exps)
    assert out == exps and metrics == {"masked_truncated_count": 2.0}  # rows stay, masked
    assert [None if e.action_mask is None else e.action_mask.tolist() for e in out] == [
        [False, False, False],
        [True, False, True],
        [False, False, False, False],
        None,
        None,
    ]


def test_the_pipeline_counts_drops_by_reason():
    pipeline = ExperiencePipeline.from_config(
        [
            OperatorConfig(name="mask_response_truncated"),
            OperatorConfig(name="dapo_dynamic_sampling"),
            OperatorConfig(name="reward_filter", args={"threshold": 0.5}),
        ]
    )
    assert pipeline.refills  # dapo_dynamic_sampling asks for the explorer's refill
    exps = [
        exp("a", 1.0, accuracy=1.0),
        exp("a", 0.2, accuracy=1.0),  # all correct: 2 dropped
        exp("b", -1.0, accuracy=-1.0, info={"finish_reason": "length"}),  # masked, then all wrong
        exp("b", -1.0, accuracy=-1.0),
        exp("c", 1.0, accuracy=1.0),  # alone: dropped without a named reason
        exp("d", 1.0, accuracy=1.0),
        exp("d", 0.4, accuracy=-1.0),  # kept by dynamic sampling, then below reward_filter's 0.5
    ]
    out = pipeline.run(exps)
    assert [(e.group_id, e.reward) for e in out.experiences] == [("d", 1.0)]
    assert out.dropped == {
        "dapo_dynamic_sampling/all_correct": 2,
        "dapo_dynamic_sampling/all_wrong": 2,
        "dapo_dynamic_sampling": 1,
        "reward_filter": 1,
    }
    assert out.metrics["pipeline/0_mask_response_truncated/masked_truncated_count"] == 1.0
    assert out.metrics["pipeline/1_dapo_dynamic_sampling/filtered_count"] == 5.0
    assert not ExperiencePipeline.from_config([OperatorConfig(name="reward_std_filter")]).refills


def test_the_std_criterion_keeps_groups_whose_scores_differ_at_any_level():
    # the shaped reward of the SmolLM2 example: 1 boxed right, 0.5 unboxed right, 0.1 boxed wrong, 0
    exps = [
        *(exp("mixed_right", r) for r in (1.0, 0.5, 0.5, 1.0)),  # all > 0: Trinity's rule drops it
        *(exp("low", r) for r in (0.0, 0.1, 0.0, 0.0)),  # differs: kept under std
        *(exp("top", 1.0) for _ in range(4)),  # flat at 1: all correct
        *(exp("zero", 0.0) for _ in range(4)),  # flat at 0: all wrong
        *(exp("half", 0.5) for _ in range(4)),  # flat at 0.5 (> threshold 0): all correct
    ]
    kept, metrics = dynamic_sampling(criterion="std").process(exps)
    assert sorted({e.group_id for e in kept}) == ["low", "mixed_right"]
    assert metrics == {"filtered_count": 12.0, "dropped_all_correct": 8.0, "dropped_all_wrong": 4.0}
    trinity_kept, _ = dynamic_sampling().process(exps)  # the default keeps only 'low' (some > 0, some not)
    assert sorted({e.group_id for e in trinity_kept}) == ["low"]
    with pytest.raises(InvalidArgument, match="criterion"):
        dynamic_sampling(criterion="variance")
