r"""Every rule on which the project's answer readers used to differ, asserting the one reader's answer.

The readers before services/explorer/rewards/answers.py: A `answers.last_boxed` / `last_number` /
`same_answer` (boxed_shaped_reward, eval's strict/lenient, math_boxed/dapo/accuracy rewards), B
`rewards.extract_boxed` / `extract_answer` / `answers_match` (math_reward), C math_eval's
`reply_answer` (Qwen2.5-Math's order), D `arith.extract_answer` (the tiny model's verifier). Each
case says what the old readers answered; the rule chosen is Trinity-RFT's unless the comment says why.
"""

from __future__ import annotations

import pytest

from services.explorer.rewards.answers import (
    final_answer,
    last_boxed,
    last_number,
    plain_answer,
    same_answer,
    tagged_answer,
    truth_answer,
)
from services.explorer.rewards.math import MathBoxedReward, math_reward
from services.explorer.rewards.shaped import shaped_score
from services.explorer.workflows.math_eval import eval_accuracy
from services.tasks.arith import answer_reward


@pytest.mark.parametrize(
    ("text", "box"),
    [
        # \fbox counts only in a text without \boxed (Trinity); A took the last of either: 7
        (r"\boxed{65} and \fbox{7}", "65"),
        (r"\fbox{12}", "12"),  # B knew only \boxed: None
        # the last box decides: cut off inside it, the reply has no boxed answer (Trinity); A fell back: 5
        (r"\boxed{5} and then \boxed{", None),
        (r"\boxed{65", None),  # C read on to `}` or `$`: 65
        (r"\boxed 3.5 apples", "3.5"),  # brace-less: the next word; A: 3, B: None, C: `3.5 apples`
        (r"\boxed 1,000", "1,000"),  # A: 1
        (r"\boxedx{3}", None),  # another command; B: 3, C: `x{3`
        (r"\boxed{5} \boxedx{3}", "5"),  # B: 3
        # an empty box is no box, skipped (measured: SmolLM2 copies the prompt's `\boxed{}`); B: "",
        # C: no answer at all; Trinity compares ""
        (r"\boxed{}", None),
        (r"\boxed{12} so \boxed{ }", "12"),
        (r"\boxed {65}", "65"),  # C: `{65`
        ("boxed{5}", None),  # no backslash, no command; C split on the bare word: 5
    ],
)
def test_last_boxed(text: str, box: str | None) -> None:
    assert last_boxed(text) == box


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (r"\boxed{} the answer is 5", "5"),  # the empty box is skipped; C stopped there: None
        (r"\boxed{5} and then \boxed{", "5"),  # no box, so the last number; C: `{`
        ("the answer is 5 apples", "5 apples"),  # Trinity's order: the stated answer first; B: 5
        ("so the answer is \\boxed{7}. It is 7", "7"),  # the box before everything
    ],
)
def test_final_answer(text: str, answer: str | None) -> None:
    assert final_answer(text) == answer


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("3,5", "5"),  # a comma that does not group thousands separates; B: `3,5`, C: 35
        ("5-3", "3"),  # a minus after a digit is an operator; B and C: -3
        ("it is .5", ".5"),  # A: none
        ("3/4 of it", "3/4"),  # a fraction read whole; C: 4
        ("It is 1,234 in total", "1,234"),  # thousands grouping; same value in A, B and C
        ("call it x2", None),  # a digit in a name; B and C: 2
    ],
)
def test_last_number(text: str, number: str | None) -> None:
    assert last_number(text) == number


@pytest.mark.parametrize(
    ("predicted", "truth", "same"),
    [
        ("Yes", "yes", True),  # words ignore case; A and B: False
        ("2\\sqrt{2}", "\\sqrt{8}", True),  # equal values; A and B compared text or numbers only
        ("$65$.", "65", True),  # every `$` goes, as Trinity; math_equiv kept an inner one: False
        ("x = 5", "5", True),  # B: False
        ("50\\%", "50", True),  # A and B: False
        ("5 apples", "5", True),  # words after a number go, as Trinity's reader drops units
        ("3 x", "3", False),  # a one-letter word is a variable
        # not Trinity's math_equal (numbers within 1e-4, or off by 100 as a percentage, are equal):
        # exact numbers, as this project's math_eval and math_boxed_reward already chose
        ("65.001", "65", False),
        ("6500", "65", False),
        ("0.333333", "1/3", False),  # B's 1e-6 tolerance said True
        ("1e3", "1000", False),  # B read Python floats: True
        # measured (SmolLM2 hacked a box that any content passed): the question copied is no answer;
        # Trinity's math_equal would simplify it to 65
        ("63+2", "65", False),
    ],
)
def test_same_answer(predicted: str, truth: str, same: bool) -> None:
    assert same_answer(predicted, truth) is same


@pytest.mark.parametrize(
    ("truth", "answer"),
    [
        ("blah\n#### 72", "72"),  # math_reward, math_boxed/dapo compared the whole GSM8K solution
        ("Add them.\nThe answer is 5.", "5"),  # a worked solution is read like a reply
        (" 42 ", "42"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),  # a one-line truth is itself; Trinity's reader takes 2
    ],
)
def test_truth_answer(truth: str, answer: str) -> None:
    assert truth_answer(truth) == answer


def test_tagged_and_plain_answers() -> None:
    # the last <answer> states the answer, as the last box does; math_reward read the first: 3
    assert tagged_answer("<answer>3</answer> then <answer>8</answer>") == "8"
    # the tiny model's reply: whitespace removed, as arith_reward; D kept inner spaces: `04 32`
    assert plain_answer("04 32<eos>99", "<eos>") == "0432"


def test_rewards_follow_the_one_reader() -> None:
    # the box outranks an \fbox: right, 1.0 (A read the fbox: 0.1)
    assert shaped_score(r"\boxed{65} and \fbox{7}", "65") == 1.0
    # a truth column in a box is read like every truth (A compared `\boxed{65}`: 0.0)
    assert shaped_score("It is 65", r"\boxed{65}") == 0.5
    # a reply cut off in its last box: no box (A: 1.0); the eval reads the last number (C: 0.0)
    assert MathBoxedReward()(response=r"\boxed{5} and then \boxed{", truth="5")["accuracy"] == 0.0
    assert eval_accuracy(r"\boxed{5} and then \boxed{", "5") == 1.0
    assert math_reward("<answer>3</answer> <answer>8</answer>", "8")["accuracy"] == 1.0
    assert answer_reward("04 32<eos>", "0432") == 1.0
