r"""Do two final answers state the same mathematical object? `equivalent(predicted, truth)`.

Steps, cheapest first:
1. Presentation goes (`strip_presentation`): every `$`, `\left`/`\right`, spacing commands (`\,` `\!` `\;`),
   `\text{..}`/`\mathrm{..}` wrappers, a trailing unit in `\text{ cm}`, degrees `^\circ`, `\%`, a
   trailing period, an equation's left-hand side (`x = 5` → `5`), thousands commas (`1,000`), words
   after a number (`5 apples` → `5`, as Trinity's Qwen2.5-Math reader drops units; words of two
   letters or more, so `3 x` stays a product).
   Equal text after that is a match (also for words: `\text{Yes}` vs `yes`, case ignored).
2. Tuples, intervals and lists (`(1, \frac{1}{2})`) match element by element, brackets equal.
3. Each side is parsed (math_parse.py, no eval) and the difference is evaluated
   numerically with 50 digits: equal when it is below 1e-12 relative. With variables, at three
   fixed points given as 60-digit floats, never exact rationals whose powers could grow without
   bound (an identity test: `2(x+1)` vs `2x+2`).

One rule keeps a model from earning credit by copying the question: when the truth is a rational
number (`65`, `0.5`, `\frac{3}{4}`), the prediction must be a number literal too (integer, decimal,
`a/b`, `\frac{a}{b}`, signed), so `63+2` does not state `65`. Other truths (`2\sqrt{2}`, `\pi/2`,
`x+1`) accept any equal form.
"""

from __future__ import annotations

import re
from typing import Any

from services.explorer.rewards.math_parse import parse_math

_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMBER_THEN_WORDS = re.compile(r"^([-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:/\d+)?)(?:\s+[A-Za-z]{2,})+$")
_NUMBER_LITERAL = re.compile(
    r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+(?:\.\d*)?)?$"
    r"|^[-+]?\\[dt]?frac\{[-+]?\d+(?:\.\d+)?\}\{[-+]?\d+(?:\.\d+)?\}$"
)
_POINTS = ("0.37", "1.91", "-2.3")
_RELATIVE_TOLERANCE = 1e-12


def strip_presentation(text: str) -> str:
    """`text` without typesetting that does not change its value (see the module docstring)."""
    text = text.replace("\\$", "").replace("$", "").strip()  # `$65$.` is 65
    text = re.sub(r"\\text\{\s+[^{}]*\}\s*$", "", text)  # a unit: `5 \text{ cm}`
    for command in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\displaystyle"):
        text = text.replace(command, "")
    previous = None
    while previous != text:
        previous, text = text, _WRAPPERS.sub(r"\1", text)
    for degree in ("^{\\circ}", "^\\circ", "\\circ", "\\%", "%", "\\$"):
        text = text.replace(degree, "")
    if "=" in text and "\\le" not in text and "\\ge" not in text:
        text = text.rsplit("=", 1)[1]
    text = text.strip().rstrip(".").strip()
    text = _NUMBER_THEN_WORDS.sub(r"\1", text)
    if _THOUSANDS.match(text.replace(" ", "")):
        text = text.replace(",", "")
    return text


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def _split_top_level(text: str) -> tuple[str, list[str], str] | None:
    """`(a, b)` → ("(", ["a", "b"], ")"); None when `text` is not a bracketed list of two or more."""
    if len(text) < 2 or text[0] not in "([{" or text[-1] not in ")]}":
        return None
    inner, parts, depth, current = text[1:-1], [], 0, ""
    for char in inner:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                return None  # `(1)+(2)`: the outer brackets are not one group
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return (text[0], parts, text[-1]) if len(parts) > 1 else None


def _value_close(difference: Any, scale: Any) -> bool | None:
    """True/False when both evaluate to finite numbers, None when they do not."""
    try:
        diff = complex(difference.evalf(50))
        size = complex(scale.evalf(50))
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None
    if any(v != v or abs(v) == float("inf") for v in (diff, size)):
        return None
    return abs(diff) <= _RELATIVE_TOLERANCE * max(1.0, abs(size))


def _same_value(a: Any, b: Any) -> bool:
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    difference = a - b
    if not symbols:
        return bool(_value_close(difference, b))
    import sympy

    checked = 0
    for shift in range(len(_POINTS)):
        values = {s: sympy.Float(_POINTS[(shift + i) % len(_POINTS)], 60) for i, s in enumerate(symbols)}
        close = _value_close(difference.subs(values), b.subs(values))
        if close is False:
            return False
        checked += close is True
    return checked >= 2


def _is_rational_number(expr: Any) -> bool:
    return bool(getattr(expr, "is_Rational", False))


def _scalar_equivalent(predicted: str, truth: str) -> bool:
    if _squash(predicted) == _squash(truth):
        return True
    truth_expr = parse_math(truth)
    if truth_expr is None:
        return False
    if _is_rational_number(truth_expr) and not _NUMBER_LITERAL.match(predicted.replace(" ", "")):
        return False
    predicted_expr = parse_math(predicted)
    if predicted_expr is None:
        return False
    try:
        return _same_value(predicted_expr, truth_expr)
    except Exception:  # noqa: BLE001 - sympy/mpmath fail in many ways (overflow, memory): not equal
        return False


def equivalent(predicted: str | None, truth: str | None) -> bool:
    """True when `predicted` states `truth` (see the module docstring for the rules)."""
    if predicted is None or truth is None:
        return False
    p, t = strip_presentation(predicted), strip_presentation(truth)
    if not p or not t:
        return False
    if _squash(p) == _squash(t):
        return True
    p_list, t_list = _split_top_level(p), _split_top_level(t)
    if p_list is not None or t_list is not None:
        if p_list is None or t_list is None or len(p_list[1]) != len(t_list[1]):
            return False
        if (p_list[0], p_list[2]) != (t_list[0], t_list[2]):
            return False
        return all(equivalent(a, b) for a, b in zip(p_list[1], t_list[1], strict=True))
    return _scalar_equivalent(p, t)
