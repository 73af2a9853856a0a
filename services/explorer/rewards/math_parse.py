r"""A small LaTeX/ASCII math parser that builds sympy expressions without `eval`.

`sympy.parse_expr` runs Python `eval` on its input, which a model's reply must never reach. This
recursive-descent parser accepts only: numbers (`3`, `0.5`, exact as rationals), single-letter
variables, `+ - * / ^`, `\cdot \times \div`, implicit multiplication (`2x`, `3\sqrt{2}`),
groups `( ) { } [ ]`, `\frac{a}{b}` (`\dfrac`, `\tfrac`), `\sqrt{x}`, `\sqrt[n]{x}`, `\pi`, `\infty`
and `\sin \cos \tan \ln \log \exp`. Anything else (a word, an unknown command) is no expression:
`parse_math` returns None and the caller compares text instead.

Bounded work, since a reward runs in a worker thread where no alarm can stop it: refused are inputs
over `MAX_CHARS` characters or `MAX_DEPTH` nested groups; a power of numbers whose result would
exceed `MAX_POWER_BITS` bits (`10^{10^{10}}` would never finish); a power with a variable whose
exponent holds a number beyond `MAX_SYMBOLIC_EXPONENT` (`x^{9^{9999}}`, `x^{9999y}`: slow to evaluate
even at a float point); exponents or functions nested deeper than `MAX_EXPONENT_NESTING`
(`x^{x^{x^{x}}}`, `\exp(\exp(\exp(x)))`: at a test point their exponent is astronomically large).
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_CHARS = 300
MAX_DEPTH = 40
MAX_POWER_BITS = 1 << 16
MAX_SYMBOLIC_EXPONENT = 1000
MAX_EXPONENT_NESTING = 2

_TOKEN = re.compile(r"\s*(\d+\.\d*|\.\d+|\d+|\\[A-Za-z]+|[A-Za-z]|[-+*/^(){}\[\]])")
_FUNCTIONS = ("sin", "cos", "tan", "ln", "log", "exp")
_OPS = {"\\cdot": "*", "\\times": "*", "\\div": "/"}
_FRACS = ("\\frac", "\\dfrac", "\\tfrac")
_CLOSE = {"(": ")", "{": "}", "[": "]"}


class ParseError(ValueError):
    """The text is not an expression this parser accepts."""


def tokenize(text: str) -> list[str]:
    """The tokens of `text`; a run of two or more letters (a word) is refused."""
    if re.search(r"(?<![\\A-Za-z])[A-Za-z]{2,}", text):
        raise ParseError("words are not expressions")
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ParseError(f"unexpected character {text[pos]!r}")
        token = match.group(1)
        tokens.append(_OPS.get(token, token))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        import sympy

        self.sp = sympy
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.exponent_nesting = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ParseError(f"expected {expected or 'more'}, found {token!r}")
        self.pos += 1
        return token

    def parse(self) -> Any:
        value = self.expr()
        if self.peek() is not None:
            raise ParseError(f"unexpected {self.peek()!r}")
        return value

    def expr(self) -> Any:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.term()
            value = value + right if op == "+" else value - right
        return value

    def term(self) -> Any:
        value = self.unary()
        while True:
            token = self.peek()
            if token in ("*", "/"):
                self.take()
                right = self.unary()
                value = value * right if token == "*" else value / right
            elif token is not None and self._starts_atom(token):
                value = value * self.power()  # implicit: 2x, 3\sqrt{2}, (a)(b)
            else:
                return value

    def unary(self) -> Any:
        if self.peek() in ("-", "+"):
            sign = self.take()
            operand = self.unary()
            return -operand if sign == "-" else operand
        return self.power()

    def power(self) -> Any:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            self.exponent_nesting += 1
            if self.exponent_nesting > MAX_EXPONENT_NESTING:
                raise ParseError("powers nested too deeply")
            exponent = self.unary()
            self.exponent_nesting -= 1
            return self._pow(base, exponent)
        return base

    def _pow(self, base: Any, exponent: Any) -> Any:
        """Refuse powers whose evaluation could not finish (see the module docstring)."""
        if not (base.is_number and exponent.is_number):
            numbers = [exponent] if exponent.is_number else list(exponent.atoms(self.sp.Number))
            try:
                too_big = any(abs(complex(n)) > MAX_SYMBOLIC_EXPONENT for n in numbers)
            except (OverflowError, TypeError, ValueError) as exc:
                raise ParseError("exponent too large") from exc
            if too_big:
                raise ParseError("exponent too large")
        if base.is_number and exponent.is_number:
            try:
                size = abs(float(exponent)) * max(1.0, math.log2(abs(float(base)) + 1.0))
            except (OverflowError, TypeError, ValueError) as exc:
                raise ParseError("power too large") from exc
            if not math.isfinite(size) or size > MAX_POWER_BITS:
                raise ParseError("power too large")
        return self.sp.Pow(base, exponent)

    @staticmethod
    def _starts_atom(token: str) -> bool:
        return (
            token[0].isdigit()
            or token[0] == "."
            or token.isalpha()
            or token in "({["
            or token.startswith("\\")
        )

    def group(self) -> Any:
        opening = self.take()
        if opening not in _CLOSE:
            raise ParseError(f"expected a group, found {opening!r}")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError("nested too deeply")
        value = self.expr()
        self.take(_CLOSE[opening])
        self.depth -= 1
        return value

    def atom(self) -> Any:
        token = self.peek()
        if token is None:
            raise ParseError("expression ends early")
        if token in _CLOSE:
            return self.group()
        self.take()
        if token[0].isdigit() or token[0] == ".":
            return self.sp.Rational(token)
        if token.isalpha():
            return self.sp.Symbol(token)
        if token in _FRACS:
            numerator = self.group()
            return numerator / self.group()
        if token == "\\sqrt":
            if self.peek() == "[":
                index = self.group()
                return self._pow(self.group(), 1 / index)
            return self.sp.sqrt(self.group())
        if token == "\\pi":
            return self.sp.pi
        if token == "\\infty":
            return self.sp.oo
        if token[1:] in _FUNCTIONS:
            self.exponent_nesting += 1  # \exp(\exp(\exp(x))) is a tower too
            if self.exponent_nesting > MAX_EXPONENT_NESTING:
                raise ParseError("functions nested too deeply")
            argument = self.group() if self.peek() in _CLOSE else self.power()
            self.exponent_nesting -= 1
            return getattr(self.sp, "log" if token[1:] == "ln" else token[1:])(argument)
        raise ParseError(f"unknown command {token!r}")


def parse_math(text: str) -> Any | None:
    """`text` as a sympy expression, or None when it is not one this parser accepts (see module doc)."""
    if len(text) > MAX_CHARS:
        return None
    try:
        return _Parser(tokenize(text)).parse()
    except (ParseError, RecursionError, ZeroDivisionError, TypeError, ValueError, OverflowError):
        return None
