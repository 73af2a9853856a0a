"""The controller language of the optimal-control CoD environment: one scalar expression, checked
against a whitelist and then evaluated by walking its syntax tree (never `eval`).

Allowed (Trinity's): numeric constants (finite, not booleans); the variables x, v, t, x_target,
v_target, horizon, remaining_steps (= max(1, horizon - t)); + - * / **; unary + - not; comparisons
(chains too), and / or, `a if c else b`; the functions abs, min, max (1 or more arguments), pow,
clip(value, low, high), ifelse(cond, a, b) (only the chosen branch is evaluated) and lt, le, gt,
ge, eq, ne (two arguments). Anything else is refused with the reason.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

VARIABLES = ("x", "v", "t", "x_target", "v_target", "horizon", "remaining_steps")
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
    ast.Not: operator.not_,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_NAMED_COMPARE = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}
_ARITY: dict[str, tuple[int, int | None]] = {
    "abs": (1, 1),
    "min": (1, None),
    "max": (1, None),
    "pow": (2, 2),
    "clip": (3, 3),
    "ifelse": (3, 3),
    **{name: (2, 2) for name in _NAMED_COMPARE},
}


def _check(node: ast.AST) -> None:
    if isinstance(node, ast.Expression):
        _check(node.body)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError("only numeric constants are allowed")
        try:
            finite = math.isfinite(float(node.value))
        except OverflowError:
            finite = False
        if not finite:
            raise ValueError("numeric constants must be finite")
    elif isinstance(node, ast.Name):
        if node.id not in VARIABLES:
            raise ValueError(f"unknown variable: {node.id}")
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise ValueError("unsupported binary operator")
        _check(node.left)
        _check(node.right)
    elif isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise ValueError("unsupported unary operator")
        _check(node.operand)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _ARITY:
            raise ValueError("unsupported function call")
        if node.keywords:
            raise ValueError("keyword arguments are not allowed")
        low, high = _ARITY[node.func.id]
        if len(node.args) < low or (high is not None and len(node.args) > high):
            raise ValueError(f"invalid argument count for {node.func.id}")
        for arg in node.args:
            _check(arg)
    elif isinstance(node, ast.IfExp):
        for part in (node.test, node.body, node.orelse):
            _check(part)
    elif isinstance(node, ast.Compare):
        if any(type(op) not in _COMPARE for op in node.ops):
            raise ValueError("unsupported comparison operator")
        for part in (node.left, *node.comparators):
            _check(part)
    elif isinstance(node, ast.BoolOp):
        for part in node.values:
            _check(part)
    else:
        raise ValueError(f"unsupported expression syntax: {type(node).__name__}")


def validate(expression: object) -> str:
    """The stripped expression, or ValueError saying what is not allowed."""
    if not isinstance(expression, str):
        raise ValueError("action_expression must be text")
    text = expression.strip()
    if not text:
        raise ValueError("action_expression cannot be empty")
    try:
        _check(ast.parse(text, mode="eval"))
    except SyntaxError as exc:
        raise ValueError(f"invalid action_expression syntax: {exc.msg}") from exc
    except RecursionError as exc:
        raise ValueError("action_expression is too deeply nested") from exc
    return text


def _eval(node: ast.AST, env: dict[str, float]) -> Any:
    if isinstance(node, ast.Constant):
        return float(node.value)  # type: ignore[arg-type]  # _check let numbers through only
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env))
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, env) else node.orelse, env)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _eval(comparator, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):  # Python's short-circuit: the deciding operand's value
        result = _eval(node.values[0], env)
        for value in node.values[1:]:
            if (not result) if isinstance(node.op, ast.And) else result:
                return result
            result = _eval(value, env)
        return result
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    name = node.func.id
    if name == "ifelse":
        return _eval(node.args[1] if _eval(node.args[0], env) else node.args[2], env)
    args = [_eval(arg, env) for arg in node.args]
    if name == "abs":
        return abs(args[0])
    if name in ("min", "max"):
        return min(args) if name == "min" else max(args)
    if name == "pow":
        return pow(args[0], args[1])
    if name == "clip":
        return max(args[1], min(args[0], args[2]))
    return _NAMED_COMPARE[name](args[0], args[1])


def compile_controller(expression: str, horizon: int) -> Callable[[float, float, int, float, float], Any]:
    """u(x, v, t, x_target, v_target) for a valid expression (validate first)."""
    tree = ast.parse(validate(expression), mode="eval").body

    def controller(x: float, v: float, t: int, x_target: float, v_target: float) -> Any:
        env = {
            "x": float(x),
            "v": float(v),
            "t": float(t),
            "x_target": float(x_target),
            "v_target": float(v_target),
            "horizon": float(horizon),
            "remaining_steps": float(max(1, horizon - t)),
        }
        return _eval(tree, env)

    return controller
