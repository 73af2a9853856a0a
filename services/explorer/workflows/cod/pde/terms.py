"""The basis library f(u) is built from and the grammar of a written equation.

An equation is a sum of `coefficient*term` pieces over the library's terms, e.g.
`1.2*u - 0.8*u**3 + 0.5*(exp(u)-1)`, optionally written `f(u) = ...`. Coefficients are numbers
(`2`, `-0.5`, `.5`, `1e-3`); a term holding a + or - may be parenthesized; whitespace and case do not
matter. A piece repeated is summed; anything else (a term outside the library, a missing `*`, a
symbol such as `c1`) makes the equation unparseable ({}), never partly read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

import numpy as np

Array = np.ndarray

BASIS: dict[str, Callable[[Array], Array]] = {
    "u": lambda u: u,
    "u**2": lambda u: u**2,
    "u**3": lambda u: u**3,
    "u**4": lambda u: u**4,
    "u**5": lambda u: u**5,
    "u**7": lambda u: u**7,
    "sin(u)": np.sin,
    "sin(2*u)": lambda u: np.sin(2.0 * u),
    "exp(u)-1": np.expm1,
    "log(1+u**2)": lambda u: np.log1p(u**2),
    "tanh(u)": np.tanh,
    "u/(1+u**2)": lambda u: u / (1.0 + u**2),
    "u**2/(1+u**2)": lambda u: u**2 / (1.0 + u**2),
    "u**4/(1+u**4)": lambda u: u**4 / (1.0 + u**4),
    "u/(1+u+u**2)": lambda u: u / (1.0 + u + u**2),
}
LIBRARY: tuple[str, ...] = tuple(BASIS)  # Trinity's DEFAULT_DICTIONARY, in its order

_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)"
_SYMBOLIC = re.compile(
    r"(?<![A-Za-z0-9_])(?:c\d+|coef(?:ficient)?\d*|a|b|alpha|beta|gamma)(?![A-Za-z0-9_])", re.IGNORECASE
)
_LEFT_SIDE = re.compile(r"\s*f\s*\(\s*u\s*\)\s*", re.IGNORECASE)


def basis(term: str, u: Array) -> Array:
    """phi_term(u), elementwise; KeyError for a term outside the library."""
    return np.asarray(BASIS[term](np.asarray(u, dtype=float)), dtype=float)


def reaction(u: Array, coefficients: Mapping[str, float]) -> Array:
    """f(u) = sum_k c_k phi_k(u)."""
    values = np.zeros_like(np.asarray(u, dtype=float))
    for term, coefficient in coefficients.items():
        values = values + float(coefficient) * basis(term, u)
    return values


def library_matrix(u: Array, terms: Iterable[str]) -> tuple[Array, list[str]]:
    """Theta [n, k]: one column phi(u) per term whose values are all finite, and those terms."""
    columns, kept = [], []
    for term in terms:
        if term not in BASIS:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            column = basis(term, u)
        if np.all(np.isfinite(column)):
            columns.append(column)
            kept.append(term)
    if not columns:
        return np.zeros((len(u), 0)), []
    return np.column_stack(columns), kept


def _term_pattern(term: str) -> str:
    if term == "u":
        return r"u(?!\*\*)"
    escaped = re.escape(term)
    return rf"(?:{escaped}|\({escaped}\))" if "+" in term or "-" in term else escaped


def parse_equation(text: object, terms: Iterable[str]) -> dict[str, float]:
    """{term: coefficient} of a written equation over `terms` (module docstring), zero terms dropped;
    {} when it does not parse."""
    body = str(text or "").strip()
    if "=" in body:
        left, body = body.split("=", 1)
        if not _LEFT_SIDE.fullmatch(left):
            return {}
    rest = re.sub(r"\s+", "", body)
    found: dict[str, float] = {}
    for term in sorted(terms, key=len, reverse=True):  # u**2/(1+u**2) before u**2 before u
        pattern = re.compile(_NUMBER + r"\*" + _term_pattern(term), re.IGNORECASE)
        while match := pattern.search(rest):
            found[term] = found.get(term, 0.0) + float(match.group(1))
            rest = rest[: match.start()] + " " * (match.end() - match.start()) + rest[match.end() :]
    if rest.replace(" ", "") not in ("", "+", "-"):  # a lone sign between pieces, as Trinity allows
        return {}
    return {term: value for term, value in found.items() if abs(value) > 1e-12}


def support_of(text: str, selection: Iterable[str], library: Iterable[str]) -> list[str]:
    """The terms of `selection` (in its order) a written equation uses: those it gives coefficients
    (parsed over `library`), else, for an equation without numbers ("u + u**3"), those it names."""
    selection = list(selection)
    parsed = parse_equation(text, library)
    if parsed:
        return [t for t in selection if t in parsed]
    compact, named = text.replace(" ", ""), set()
    for term in sorted(selection, key=len, reverse=True):
        pattern = _term_pattern(term)
        if re.search(pattern, compact, re.IGNORECASE):
            named.add(term)
            compact = re.sub(pattern, "", compact, flags=re.IGNORECASE)
    return [t for t in selection if t in named]


def format_equation(coefficients: Mapping[str, float]) -> str:
    """`1.2*u - 0.8*u**3` (3 significant digits, compound terms parenthesized); `0` when empty."""
    if not coefficients:
        return "0"
    pieces = [
        f"{value:.3g}*" + (f"({term})" if "+" in term or "-" in term else term)
        for term, value in coefficients.items()
    ]
    return pieces[0] + "".join(f" - {p[1:]}" if p.startswith("-") else f" + {p}" for p in pieces[1:])


def symbolic_coefficients(text: object) -> list[str]:
    """Placeholder coefficients (c1, coef2, a, b, alpha, beta, gamma) a written equation uses."""
    return sorted(set(_SYMBOLIC.findall(str(text or ""))))
