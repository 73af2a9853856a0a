r"""math_boxed_reward, format_reward, math_dapo_reward and the answer checking under them.

Expected values are worked out by hand in the comments, from the rules in
services/explorer/rewards/math.py (Trinity-RFT v0.5.2's) and services/explorer/rewards/math_equiv.py.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import InvalidArgument
from services.explorer.rewards import REWARD_FUNCTIONS, resolve_reward
from services.explorer.rewards.math import (
    FormatReward,
    MathBoxedReward,
    MathDAPOReward,
    dapo_answer,
    overlong_penalty,
)
from services.explorer.rewards.math_equiv import equivalent
from services.explorer.rewards.math_parse import parse_math


@pytest.mark.parametrize(
    ("predicted", "truth", "same"),
    [
        ("42", "42", True),
        ("\\boxed{42}", "42", False),  # equivalent() compares answers; the box is taken off before
        ("\\frac{1}{2}", "0.5", True),  # 1/2 = 0.5 exactly (decimals are parsed as rationals)
        ("1/2", "\\frac{1}{2}", True),
        ("\\dfrac{1}{2}", ".5", True),
        ("\\frac {1} { 2 }", "\\frac{1}{2}", True),  # LaTeX spacing
        ("\\left( 1, \\frac{1}{2} \\right)", "(1,0.5)", True),  # element by element
        ("(1, 2)", "[1, 2]", False),  # an open and a closed interval differ
        ("(1, 2)", "(2, 1)", False),  # order counts in a tuple
        ("1,000", "1000", True),  # thousands comma
        ("65.0", "65", True),
        ("63+2", "65", False),  # a rational truth wants a number literal, not the question copied
        ("\\frac{4}{2}", "2", True),  # a fraction literal is a number literal
        ("2\\sqrt{2}", "\\sqrt{8}", True),  # 2*2^(1/2) = 8^(1/2)
        ("\\frac{\\pi}{2}", "\\pi/2", True),
        ("3.14", "\\pi", False),
        ("0.3333333333", "\\frac{1}{3}", False),  # differs by 1/(3*10^10) > 1e-12
        ("2(x+1)", "2x+2", True),  # equal at every test point
        ("x^2+1", "x^2-1", False),  # differ by 2 everywhere
        ("x = 5", "5", True),  # the right-hand side is the answer
        ("5 \\text{ cm}", "5", True),  # a trailing unit goes
        ("90^\\circ", "90", True),
        ("50\\%", "50", True),
        ("\\text{Yes}", "yes", True),  # words compare as text, case ignored
        ("yes", "sey", False),  # a word is not x*y*z: no algebra on letters
        ("", "0", False),
    ],
)
def test_equivalent(predicted: str, truth: str, same: bool) -> None:
    assert equivalent(predicted, truth) is same


def test_parser_refuses_what_it_must_not_evaluate() -> None:
    assert parse_math("__import__('os').system('true')") is None  # no eval: `_`, `'` are not tokens
    assert parse_math("10^{10^{10}}") is None  # 10^10 * log2(11) bits: refused before sympy sees it
    assert parse_math("(" * 60 + "1" + ")" * 60) is None  # deeper than MAX_DEPTH
    assert parse_math("1+" * 200 + "1") is None  # longer than MAX_CHARS
    started = time.monotonic()
    assert not equivalent("9^{9^{9}}", "1")
    assert not equivalent("x^{9^{9999}}", "x")  # 31,700-bit exponent: minutes at a float point
    assert not equivalent("x^{9^{9999} y}", "x")
    assert not equivalent("x^{x^{x^{x}}}", "x")  # a tower: refused
    assert not equivalent("\\exp(\\exp(\\exp(\\exp(x))))", "x")
    assert time.monotonic() - started < 5.0
    assert equivalent("x^{x}", "x^{x}") and equivalent("e^{2x}", "(e^{x})^{2}")  # shallow ones pass
    assert parse_math("2^{10}") == 1024


def test_math_boxed_reward_by_hand() -> None:
    reward = MathBoxedReward()
    # boxed 1/2 states 0.5; with_think off: no format part
    assert reward(response="so \\boxed{\\frac{1}{2}}", truth="0.5") == {"accuracy": 1.0, "format_score": 0.0}
    # no box: accuracy 0 even though 42 is written (Trinity reads only the box)
    assert reward(response="the answer is 42", truth="42") == {"accuracy": 0.0, "format_score": 0.0}
    # the truth may itself be boxed (MATH solutions)
    assert reward(response="\\boxed{7}", truth="so it is \\boxed{7}.")["accuracy"] == 1.0
    # with_think and no think block: -format_score_coef = -0.1; correct box: total 0.9
    parts = reward(response="\\boxed{3}", truth="3", with_think=True)
    assert parts == {"accuracy": 1.0, "format_score": -0.1}
    # with_think, one <think> before one </think>: no penalty
    ok = "<think>\n3 = 1 + 2\n</think>\n\\boxed{3}"
    assert reward(response=ok, truth="3", with_think=True, format_score_coef=0.5)["format_score"] == 0.0
    # two think blocks: penalty of the coef given, 0.5
    twice = "<think>a</think><think>b</think>\\boxed{3}"
    assert reward(response=twice, truth="3", with_think=True, format_score_coef=0.5)["format_score"] == -0.5
    # </think> before <think>: penalty
    assert reward(response="</think><think>\\boxed{3}", truth="3", with_think=True)["format_score"] == -0.1


def test_math_boxed_reward_args_from_reward_fn_args() -> None:
    reward = resolve_reward(REWARD_FUNCTIONS.get("math_boxed_reward"), {"with_think": True})
    # wrong box (4 vs 3): accuracy 0; with_think from reward_fn_args, no think block: -0.1
    assert reward(response="\\boxed{4}", truth="3") == {"accuracy": 0.0, "format_score": -0.1}
    # as async_math_workflow calls it (the entropy/clipb example): prompt passed, nothing else
    plain = resolve_reward(REWARD_FUNCTIONS.get("math_boxed_reward"), {})
    assert plain(response="\\boxed{3}", truth="3", prompt="1+2?") == {"accuracy": 1.0, "format_score": 0.0}
    with pytest.raises(TypeError):
        MathBoxedReward(with_thinking=True)  # type: ignore[call-arg]  # a misspelt arg is refused


def test_format_reward() -> None:
    reward = REWARD_FUNCTIONS.get("format_reward")()
    assert reward(response="<think>\nr\n</think>\n<answer>\n5\n</answer>") == {"format_score": 0.1}
    assert reward(response="<think>r</think><answer>5</answer>") == {"format_score": -0.1}  # no newlines
    assert reward(response="5") == {"format_score": -0.1}
    custom = FormatReward(pattern=r".*\\boxed\{.+\}")
    assert custom(response="so \\boxed{5}", truth="5") == {"format_score": 0.1}
    with pytest.raises(InvalidArgument, match="pattern"):
        FormatReward(pattern="(")


def test_overlong_penalty_by_hand() -> None:
    # L_max = 20, L_cache = 4, factor 1: no penalty up to 16 tokens, then -1/4 per token, -1 beyond 20
    args = {"max_response_length": 20, "cache_length": 4, "penalty_factor": 1.0}
    assert overlong_penalty(10, **args) == 0.0
    assert overlong_penalty(16, **args) == 0.0
    assert overlong_penalty(17, **args) == -0.25  # (16 - 17) / 4 * 1
    assert overlong_penalty(18, **args) == -0.5
    assert overlong_penalty(20, **args) == -1.0  # (16 - 20) / 4
    assert overlong_penalty(21, **args) == -1.0
    assert overlong_penalty(18, **{**args, "penalty_factor": 2.0}) == -1.0  # (16 - 18) / 4 * 2


def test_math_dapo_reward_by_hand() -> None:
    plain = MathDAPOReward()
    # +1 correct, -1 wrong (DAPO sec. 2.4); no penalty when it is off
    assert plain(response="\\boxed{\\frac{1}{2}}", truth="0.5") == {"accuracy": 1.0, "format_score": 0.0}
    assert plain(response="\\boxed{2}", truth="0.5") == {"accuracy": -1.0, "format_score": 0.0}
    # the box after the last </think> counts, not one inside the thinking
    assert dapo_answer("<think>\\boxed{1}</think> so \\boxed{2}") == "2"
    assert dapo_answer("<think>\\boxed{1}</think> no box") == "no box"
    # no box: the last `Answer:` line (the DAPO example's prompt asks for it)
    assert plain(response="work...\nAnswer: 1/2", truth="0.5")["accuracy"] == 1.0
    penalised = REWARD_FUNCTIONS.get("math_dapo_reward")(
        enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=20, cache_length=4
    )
    # correct (+1) and 18 tokens: (16 - 18) / 4 = -0.5
    parts = penalised(response="\\boxed{7}", truth="7", response_token=list(range(18)))
    assert parts == {"accuracy": 1.0, "format_score": -0.5}
    with pytest.raises(InvalidArgument, match="response_token"):
        penalised(response="\\boxed{7}", truth="7")


def test_math_dapo_reward_refuses_an_incomplete_penalty() -> None:
    with pytest.raises(InvalidArgument, match="cache_length"):
        MathDAPOReward(enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=20)
    with pytest.raises(InvalidArgument, match="cache_length"):
        MathDAPOReward(
            enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=4, cache_length=4
        )


_MATH_PIECES = [
    "1",
    "9",
    "0",
    ".5",
    "x",
    "y",
    "e",
    "+",
    "-",
    "*",
    "/",
    "^",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    ",",
]
_MATH_PIECES += [
    "\\frac",
    "\\sqrt",
    "\\pi",
    "\\exp",
    "\\sin",
    "\\ln",
    "\\cdot",
    "\\text{",
    "\\boxed{",
    "=",
    " ",
]


@settings(max_examples=300, deadline=2000)
@given(
    st.lists(st.sampled_from(_MATH_PIECES), max_size=40), st.sampled_from(["1", "x", "\\sqrt{2}", "(1,2)"])
)
def test_any_answer_text_is_judged_quickly_and_never_raises(pieces: list[str], truth: str) -> None:
    answer = "".join(pieces)
    assert equivalent(answer, truth) in (True, False)
    assert MathBoxedReward()(response=f"\\boxed{{{answer}}}", truth=truth)["accuracy"] in (0.0, 1.0)


@pytest.mark.parametrize(
    ("response", "truth", "accuracy"),
    [
        (r"\boxed{42}", "42", 1.0),  # the case: a boxed answer against a bare truth
        (r"so $\frac{1}{2}$", "0.5", 1.0),  # no box: the last inline LaTeX span
        (r"\[ 2\sqrt{2} \] and then \boxed{\sqrt{8}}", r"$2\sqrt{2}$", 1.0),  # the box wins, truth in $
        ("42", "42", 0.0),  # plain text has no LaTeX anchor (Trinity's extraction needs one)
        (r"\boxed{41}", "42", 0.0),
        (r"\boxed{42}", None, 0.0),
    ],
)
def test_accuracy_reward_parses_latex_answers(response, truth, accuracy):
    assert REWARD_FUNCTIONS.get("accuracy_reward")()(response=response, truth=truth) == {"accuracy": accuracy}


def test_accuracy_reward_with_an_answer_parser_by_dotted_path():
    reward = REWARD_FUNCTIONS.get("accuracy_reward")(
        answer_parser="services.explorer.rewards.answers:last_boxed"
    )
    assert reward(response=r"x \boxed{7}", truth=r"\boxed{7}") == {"accuracy": 1.0}
    assert reward(response="7", truth=r"\boxed{7}") == {"accuracy": 0.0}


def test_math_reward_adds_trinitys_format_part():
    from services.explorer.rewards.math import math_reward

    good = "<think>\n3 + 4\n</think>\n<answer>7</answer>"
    assert math_reward(good, "7") == {"accuracy": 1.0, "format_score": 0.1}
    # the <answer> tag is read first: the 3 and 4 of the reasoning do not count
    assert math_reward("<think>7?</think><answer>8</answer>", "7") == {"accuracy": 0.0, "format_score": 0.1}
    assert math_reward(r"it is \boxed{7}", "7") == {"accuracy": 1.0, "format_score": -0.1}
