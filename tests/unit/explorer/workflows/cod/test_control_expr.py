"""The optimal-control controller language: what is allowed, what is refused, and its values."""

from __future__ import annotations

import pytest

from services.explorer.workflows.cod.control_expr import compile_controller, validate


@pytest.mark.parametrize(
    ("expression", "x", "v", "t", "expected"),
    [
        ("-0.5 * (x - x_target) - v", 2.0, 1.0, 0, -0.5 * (2.0 - 3.0) - 1.0),
        ("clip((x_target - x) / remaining_steps, -1, 1)", 0.0, 0.0, 2, 0.75),  # (3 - 0) / (6 - 2)
        ("ifelse(lt(x, x_target), 1, -1)", 0.0, 0.0, 0, 1.0),
        ("1 if x > 5 else min(v, 0.2, 3)", 0.0, 0.5, 0, 0.2),
        ("0 < x < 1 and 2 or 3", 0.5, 0.0, 0, 2.0),
        ("pow(abs(v), 2) + horizon", 0.0, -2.0, 0, 10.0),
    ],
)
def test_values(expression: str, x: float, v: float, t: int, expected: float) -> None:
    assert compile_controller(expression, horizon=6)(x, v, t, 3.0, 0.0) == pytest.approx(expected)


def test_ifelse_evaluates_only_the_chosen_branch() -> None:
    assert compile_controller("ifelse(1, 2, 1 / 0)", horizon=1)(0, 0, 0, 0, 0) == 2.0


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os')", "unsupported function call"),
        ("y + 1", "unknown variable: y"),
        ("x // 2", "unsupported binary operator"),
        ("'a'", "only numeric constants"),
        ("True", "only numeric constants"),
        ("1e999", "finite"),
        ("max()", "invalid argument count"),
        ("x.real", "unsupported expression syntax"),
        ("", "cannot be empty"),
        ("x +", "invalid action_expression syntax"),
        ("clip(x, low=1, high=2)", "unsupported function call|keyword arguments"),
    ],
)
def test_refusals(expression: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        validate(expression)
