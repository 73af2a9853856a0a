"""Reward functions: plain callables returning named reward parts; the reward is their sum.

`fn(response=..., truth=..., prompt=..., **reward_fn_args) -> dict[str, float] | float`. Classes
(Trinity's RewardFn, constructed once with reward_fn_args and then called) and plain functions
(TRL style) are both accepted; `call_reward` normalizes. Register with
`@REWARD_FUNCTIONS.register_module("name")` or name a dotted path in the config.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from services.explorer.answers import balanced_braces
from services.explorer.math_equiv import equivalent
from services.explorer.registry import Registry

REWARD_FUNCTIONS = Registry(
    "reward function",
    {
        "math_reward": "services.explorer.rewards:math_reward",
        "accuracy_reward": "services.explorer.math_rewards:AccuracyReward",
        "exact_match_reward": "services.explorer.rewards:exact_match_reward",
        "countdown_reward": "services.explorer.rewards:countdown_reward",
        "arith_reward": "services.explorer.rewards:arith_reward",
        "boxed_shaped_reward": "services.explorer.shaped_reward:boxed_shaped_reward",
        "math_boxed_reward": "services.explorer.math_rewards:MathBoxedReward",
        "format_reward": "services.explorer.math_rewards:FormatReward",
        "math_dapo_reward": "services.explorer.math_rewards:MathDAPOReward",
        "rm_gallery_reward": "services.explorer.rm_gallery_reward:RMGalleryReward",
    },
)


class RewardFn:
    """Base class for reward objects (Trinity's RewardFn): constructed with reward_fn_args, called per response."""

    def __call__(self, **kwargs: Any) -> dict[str, float]:
        raise NotImplementedError


def resolve_reward(spec: Any, args: dict[str, Any] | None = None) -> Callable[..., dict[str, float]]:
    """A RewardFn class is instantiated with `args`; a function gets `args` on every call."""
    args = args or {}
    if isinstance(spec, type):
        instance = spec(**args)
        return lambda **kw: _as_parts(instance(**kw))
    return lambda **kw: _as_parts(spec(**kw, **args))


def _as_parts(value: Any) -> dict[str, float]:
    if isinstance(value, dict):
        return {str(k): float(v) for k, v in value.items()}
    return {"reward": float(value)}


# --- answer extraction ---------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def extract_boxed(text: str) -> str | None:
    r"""Content of the last \boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    inner = balanced_braces(text, i)
    return None if inner is None else inner.strip()


def extract_answer(text: str) -> str | None:
    """The boxed answer if any, else the last number in the text."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _to_number(text: str) -> Fraction | float | None:
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    cleaned = re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"\1/\2", cleaned)
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        try:
            return float(cleaned)
        except ValueError:
            return None


def _normalize(text: str) -> str:
    text = text.strip().strip("$").replace(" ", "")
    return re.sub(r"\\(?:text|mathrm)\{([^{}]*)\}", r"\1", text).rstrip(".")


def answers_match(predicted: str | None, truth: str | None, tolerance: float = 1e-6) -> bool:
    """Exact match after normalization, or numeric match within `tolerance` (relative)."""
    if predicted is None or truth is None:
        return False
    truth = extract_boxed(truth) or truth
    if _normalize(predicted) == _normalize(truth):
        return True
    a, b = _to_number(predicted), _to_number(truth)
    if a is None or b is None:
        return False
    return math.isclose(float(a), float(b), rel_tol=tolerance, abs_tol=tolerance)


# Trinity-RFT's math_reward format: reasoning in <think>, then the answer in <answer>, at the end
MATH_FORMAT = re.compile(r".*?<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL | re.MULTILINE)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def math_reward(response: str, truth: str | None = None, **_: Any) -> dict[str, float]:
    """Trinity's math_reward: `accuracy` 1 when the answer (inside <answer></answer> when present;
    boxed, else the last number) equals the truth mathematically, else 0; plus `format_score` +0.1
    for the <think>…</think><answer>…</answer> layout, else -0.1."""
    tagged = _ANSWER_TAG.search(response)
    answer = extract_answer(tagged.group(1) if tagged else response)
    right = answers_match(answer, truth) or (
        answer is not None and truth is not None and equivalent(answer, extract_boxed(truth) or truth)
    )
    return {"accuracy": 1.0 if right else 0.0, "format_score": 0.1 if MATH_FORMAT.match(response) else -0.1}


def exact_match_reward(response: str, truth: str | None = None, **_: Any) -> dict[str, float]:
    """1 when the stripped response equals the stripped truth."""
    return {"accuracy": 1.0 if truth is not None and response.strip() == str(truth).strip() else 0.0}


def arith_reward(response: str, truth: str | None = None, **_: Any) -> dict[str, float]:
    """Embedded demo: 1 when the text generated before EOS, whitespace removed, equals the answer."""
    if truth is None:
        return {"accuracy": 0.0}
    return {"accuracy": 1.0 if re.sub(r"\s+", "", response) == re.sub(r"\s+", "", str(truth)) else 0.0}


# --- countdown -----------------------------------------------------------------------------------

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
    """Countdown (TinyZero / Trinity): an equation in <answer>...</answer> that uses each given number
    exactly once and equals the target scores 1; a well-formed but wrong equation scores format_score.

    numbers/target come from the keyword arguments or from `truth` ({"numbers": [...], "target": n},
    as a dict or JSON string).
    """
    if (numbers is None or target is None) and truth is not None:
        import json

        spec = json.loads(truth) if isinstance(truth, str) else truth
        numbers, target = spec["numbers"], spec["target"]
    matches = re.findall(r"<answer>(.*?)</answer>", response, flags=re.S)
    if not matches or numbers is None or target is None:
        return {"accuracy": 0.0, "format": 0.0}
    equation = matches[-1].split("=")[0].strip()
    try:
        used: list[int] = []
        value = _eval_arith(ast.parse(equation, mode="eval"), used)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return {"accuracy": 0.0, "format": format_score}
    if sorted(used) != sorted(int(n) for n in numbers) or value != Fraction(int(target)):
        return {"accuracy": 0.0, "format": format_score}
    return {"accuracy": 1.0, "format": 0.0}
