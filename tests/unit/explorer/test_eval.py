"""mean@k / best@k / worst@k of eval results, against numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.experience import Experience
from services.explorer.eval import answer_records, score_results
from services.explorer.runner import UnitResult
from services.explorer.workflows.base import Task


def sample(reward: float, accuracy: float) -> Experience:
    return Experience(
        tokens=np.array([1, 2, 3]),
        prompt_length=2,
        model_version=0,
        reward=reward,
        metrics={"accuracy": accuracy},
    )


def test_mean_best_worst_at_k_over_tasks():
    # k = 2 samples per task (the most any task has):
    #   task a: rewards [1.0, 0.0], accuracy [1, 0]
    #   task b: rewards [0.5, 0.25], accuracy [1, 1]    (two units of one sample each, same task id)
    #   task c: every rollout skipped -> counts as one sample of 0 for every metric
    # reward   mean@2 = (0.5 + 0.375 + 0) / 3 = 0.291667; best@2 = (1 + 0.5 + 0) / 3 = 0.5;
    #          worst@2 = (0 + 0.25 + 0) / 3 = 0.083333
    # accuracy mean@2 = (0.5 + 1 + 0) / 3 = 0.5;        best@2 = (1 + 1 + 0) / 3 = 0.666667;
    #          worst@2 = (0 + 1 + 0) / 3 = 0.333333
    a, b, c = Task(task_id="a"), Task(task_id="b"), Task(task_id="c")
    results = [
        UnitResult(a, None, [sample(1.0, 1.0), sample(0.0, 0.0)]),
        UnitResult(b, 0, [sample(0.5, 1.0)]),
        UnitResult(b, 1, [sample(0.25, 1.0)]),
        UnitResult(c, None, [], skipped=True),
    ]
    scores = score_results("test", results)
    expected = {
        "eval/test/reward/mean@2": 0.291667,
        "eval/test/reward/best@2": 0.5,
        "eval/test/reward/worst@2": 0.083333,
        "eval/test/accuracy/mean@2": 0.5,
        "eval/test/accuracy/best@2": 0.666667,
        "eval/test/accuracy/worst@2": 0.333333,
        "eval/test/tasks": 3.0,
    }
    assert scores.keys() == expected.keys()
    for key, value in expected.items():
        assert scores[key] == pytest.approx(value, abs=1e-6), key


def test_one_sample_per_task_gives_mean_at_1_only():
    # k = 1: mean@1 of rewards [1, 0, 1] = 2/3; best/worst@1 would equal it and are not reported
    results = [UnitResult(Task(task_id=str(i)), None, [sample(r, r)]) for i, r in enumerate([1.0, 0.0, 1.0])]
    scores = score_results("t", results)
    assert scores == pytest.approx(
        {"eval/t/reward/mean@1": 2 / 3, "eval/t/accuracy/mean@1": 2 / 3, "eval/t/tasks": 3.0}
    )
    assert score_results("t", []) == {}


def test_pass_rates_per_task_from_accuracy_or_positive_reward():
    from services.explorer.step_metrics import pass_rates

    # task a: accuracy metric [1, 0, 1] -> 2/3; task b: no accuracy, rewards [0.5, -1] -> share > 0 = 1/2
    b0 = Experience(tokens=np.array([1, 2]), prompt_length=1, model_version=0, reward=0.5)
    b1 = Experience(tokens=np.array([1, 2]), prompt_length=1, model_version=0, reward=-1.0)
    results = [
        UnitResult(Task(task_id="a"), None, [sample(1.0, 1.0), sample(0.0, 0.0), sample(1.0, 1.0)]),
        UnitResult(Task(task_id="b"), 0, [b0]),
        UnitResult(Task(task_id="b"), 1, [b1]),
    ]
    assert pass_rates(results) == pytest.approx({"a": 2 / 3, "b": 0.5})
    # math_dapo_reward's accuracy is +1 / -1: [1, -1, -1] passes 1 of 3, not (1 - 1 - 1) / 3
    dapo = [sample(0.0, 1.0), sample(-2.0, -1.0), sample(-2.0, -1.0)]
    assert pass_rates([UnitResult(Task(task_id="c"), None, dapo)]) == pytest.approx({"c": 1 / 3})


def test_answer_records_keep_each_samples_question_truth_and_answer():
    def answered(run: int, reply: str, reward: float) -> Experience:
        return Experience(
            tokens=np.array([1, 2, 3]),
            prompt_length=2,
            model_version=3,
            reward=reward,
            run_id=run,
            prompt_text="2+2=",
            response_text=reply,
            info={"truth": "4"},
        )

    result = UnitResult(
        task=Task(task_id="t7"), run_index=None, experiences=[answered(0, "4", 1.0), answered(1, "5", 0.0)]
    )
    assert answer_records("heldout", [result]) == [
        {
            "taskset": "heldout",
            "task_id": "t7",
            "run_id": 0,
            "question": "2+2=",
            "truth": "4",
            "answer": "4",
            "reward": 1.0,
        },
        {
            "taskset": "heldout",
            "task_id": "t7",
            "run_id": 1,
            "question": "2+2=",
            "truth": "4",
            "answer": "5",
            "reward": 0.0,
        },
    ]
