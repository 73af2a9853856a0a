"""`countdown_reward` (TinyZero / Trinity): an equation over the given numbers that hits the target."""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from services.explorer.rewards.answers import tagged_answer

_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _eval_arith(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval_arith(node.body, used)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_arith(node.left, used), _eval_arith(node.right, used))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_arith(node.operand, used)
    raise ValueError("only integers, + - * / and parentheses are allowed")


def countdown_reward(
    response: str,
    truth: Any = None,
    *,
    numbers: list[int] | None = None,
    target: int | None = None,
    format_score: float = 0.1,
    **_: Any,
) -> dict[str, float]:
    """Countdown (TinyZero / Trinity): an equation in the last <answer>...</answer> that uses each given
    number exactly once and equals the target scores 1; a well-formed but wrong equation scores format_score.

    numbers/target come from the keyword arguments or from `truth` ({"numbers": [...], "target": n},
    as a dict or JSON string).
    """
    if (numbers is None or target is None) and truth is not None:
        spec = json.loads(truth) if isinstance(truth, str) else truth
        numbers, target = spec["numbers"], spec["target"]
    tagged = tagged_answer(response)
    if tagged is None or numbers is None or target is None:
        return {"accuracy": 0.0, "format": 0.0}
    equation = tagged.split("=")[0].strip()
    try:
        used: list[int] = []
        value = _eval_arith(ast.parse(equation, mode="eval"), used)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return {"accuracy": 0.0, "format": format_score}
    if sorted(used) != sorted(int(n) for n in numbers) or value != Fraction(int(target)):
        return {"accuracy": 0.0, "format": format_score}
    return {"accuracy": 1.0, "format": 0.0}
