r"""The answer reader (services/explorer/rewards/answers.py) and the shaped reward built on it.

The rules where the project's readers used to differ: tests/unit/explorer/rewards/test_answer_rules.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.eval import answer_metrics, score_results, wants_answer_metrics
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.rewards.answers import last_boxed, last_number, same_answer
from services.explorer.rewards.shaped import boxed_shaped_reward, shaped_score
from services.explorer.runner import UnitResult
from services.explorer.workflows.base import Task


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{65}.", "65"),
        (r"\boxed{7} then \boxed{65}", "65"),  # the last box counts
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces balanced
        (r"\boxed{\text{65 apples}}", r"\text{65 apples}"),
        (r"\boxed 7.", "7"),  # TeX's brace-less argument
        (r"\fbox{12}", "12"),
        (r"\boxed{65", None),  # never closed: no box
        (r"\boxed{5} and then \boxed{", None),  # the last box decides: one never closed is no answer
        ("no box at all: 65", None),
        (r"\boxedx{3}", None),  # another command, not a box
        (r"The answer is \boxed{}.", None),  # the prompt's literal copied: no box
        (r"\boxed{12} so \boxed{ }", "12"),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "truth"),
    [
        ("65", "65"),
        ("65.0", "65"),
        ("1,000", "1000"),
        ("-12", "-12"),
        ("3/4", "0.75"),
        (r"\frac{3}{4}", "3/4"),
        (r"-\frac{3}{4}", "-3/4"),
        (r"\text{65}", "65"),
        ("$65$.", "65"),
        ("63 + 2 = 65", "65"),  # an equation: its right-hand side
    ],
)
def test_same_number_written_differently(text: str, truth: str) -> None:
    assert same_answer(text, truth)


@pytest.mark.parametrize(
    ("text", "truth"),
    [
        ("63+2", "65"),  # an unevaluated expression is not the answer
        ("3, 5", "5"),  # a list is not one number
        ("1,00", "100"),  # not a thousands grouping
        ("1/0", "0"),
        ("sixty-five", "65"),
    ],
)
def test_not_the_number(text: str, truth: str) -> None:
    assert not same_answer(text, truth)


def test_last_number_and_same_answer() -> None:
    assert last_number("63 + 2 equals 65.") == "65"
    assert last_number("It is 1,234 in total") == "1,234"
    assert last_number("no digits") is None
    assert same_answer(r"$\text{x} = 4$.", "4")
    assert same_answer("65.00", "65")
    assert same_answer(r"\text{yes}", "yes")
    assert not same_answer(None, "65")
    assert not same_answer("63+2", "65")


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        (r"63 + 2 = \boxed{65}", 1.0),  # boxed, right
        (r"\boxed{65.0}", 1.0),
        ("63 + 2 = 65", 0.5),  # not boxed, last number right
        ("65 is wrong, it is 64", 0.0),  # not boxed, last number wrong
        (r"\boxed{7}", 0.1),  # boxed, wrong: the small credit, never more
        (r"the answer is \boxed{65} no wait \boxed{64}", 0.1),  # the last box decides
        (r"\boxed{63+2}", 0.1),  # the question copied into the box is a wrong answer
        ("I do not know", 0.0),
        ("10 + 7 = 8\n\nThe answer is \\boxed{}.", 0.0),  # seen from SmolLM2: empty box, wrong number
        ("63 + 2 = 65. The answer is \\boxed{}.", 0.5),  # empty box: judged by the last number
        ("", 0.0),
    ],
)
def test_shaped_score_by_hand(reply: str, score: float) -> None:
    assert shaped_score(reply, "65") == score


def test_shaped_reward_registered_weights_and_errors() -> None:
    fn = REWARD_FUNCTIONS.get("boxed_shaped_reward")
    assert fn is boxed_shaped_reward
    assert fn(response=r"\boxed{65}", truth="65", prompt="What is 63 + 2?") == {"reward": 1.0}
    assert fn(response=r"\boxed{7}", truth="65", boxed_wrong=0.0) == {"reward": 0.0}
    assert fn(response="65", truth="65", unboxed_correct=0.25) == {"reward": 0.25}
    with pytest.raises(InvalidArgument, match="response_key"):
        fn(response="65", truth=None)


def test_answer_metrics_by_hand() -> None:
    assert answer_metrics(r"63 + 2 = \boxed{65}", "65") == {
        "strict": 1.0,
        "lenient": 1.0,
        "boxed": 1.0,
        "reply_chars": 19.0,
    }
    assert answer_metrics("it is 65", "65") == {
        "strict": 0.0,
        "lenient": 1.0,
        "boxed": 0.0,
        "reply_chars": 8.0,
    }
    # a wrong box is wrong for lenient too: the box is the stated answer, the numbers before it are work
    assert answer_metrics(r"65? no: \boxed{7}", "65")["lenient"] == 0.0


def test_eval_scores_answer_metrics_only_for_boxed_tasksets() -> None:
    def exp(text: str, reward: float) -> Experience:
        return Experience(
            tokens=np.array([1, 2]),
            prompt_length=1,
            model_version=0,
            response_text=text,
            reward=reward,
            info={"truth": "65"},
        )

    task = Task(task_id="t")
    results = [UnitResult(task, None, [exp(r"\boxed{65}", 1.0), exp("65", 0.5)])]
    scores = score_results("held", results, with_answers=True)
    assert scores["eval/held/strict/mean@2"] == 0.5
    assert scores["eval/held/lenient/mean@2"] == 1.0
    assert scores["eval/held/boxed/mean@2"] == 0.5
    assert scores["eval/held/reply_chars/mean@2"] == (10 + 2) / 2
    assert "eval/held/strict/mean@2" not in score_results("held", results)
    # a reward fn whose parts repeat the total ({"reward": r}, as boxed_shaped_reward's) is one sample
    one = [UnitResult(task, None, [exp(r"\boxed{65}", 1.0)])]
    one[0].experiences[0].metrics["reward"] = 1.0
    assert score_results("held", one, with_answers=True)["eval/held/reward/mean@1"] == 1.0

    class TasksetCfg:
        default_reward_fn_type = "boxed_shaped_reward"

    assert wants_answer_metrics(TasksetCfg())
    assert wants_answer_metrics(object(), "boxed_shaped_reward")
    assert not wants_answer_metrics(object(), "math_reward")
