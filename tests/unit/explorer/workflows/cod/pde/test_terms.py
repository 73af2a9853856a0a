"""The equation grammar: what parses, what is refused whole, and how equations are written back."""

from __future__ import annotations

import numpy as np
import pytest

from services.explorer.workflows.cod.pde.terms import (
    LIBRARY,
    format_equation,
    library_matrix,
    parse_equation,
    reaction,
    support_of,
    symbolic_coefficients,
)

LIB = list(LIBRARY)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.2*u - 0.8*u**3", {"u": 1.2, "u**3": -0.8}),
        ("f(u) = 0.5*(exp(u)-1) + 2*u**2/(1+u**2)", {"exp(u)-1": 0.5, "u**2/(1+u**2)": 2.0}),
        ("F ( U ) = -1e-1*U + .5*u", {"u": 0.4}),  # case-blind; a repeated term is summed
        ("0.3*u**2/(1+u**2) - 0.7*u/(1+u+u**2)", {"u**2/(1+u**2)": 0.3, "u/(1+u+u**2)": -0.7}),
        ("1*u + -2*u**3", {"u": 1.0, "u**3": -2.0}),  # a lone sign between pieces
        ("2*u - 2*u + 1*tanh(u)", {"tanh(u)": 1.0}),  # a term summing to zero is dropped
    ],
)
def test_equations_that_parse(text: str, expected: dict[str, float]) -> None:
    assert parse_equation(text, LIB) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text",
    ["1.2*u + c1*u**3", "1.2*u + u**3", "u**3*1.2", "g(u) = 1*u", "1.2*u + 0.5*cos(u)", "", "0.7*u**6"],
)
def test_an_equation_with_anything_unparsed_is_refused_whole(text: str) -> None:
    assert parse_equation(text, LIB) == {}


def test_only_the_given_terms_parse() -> None:
    assert parse_equation("1*u + 1*u**3", ["u"]) == {}


def test_format_writes_three_significant_digits_and_parenthesizes_compound_terms() -> None:
    text = format_equation({"u": 1.2345, "exp(u)-1": -0.5, "u**3": 1234.5})
    assert text == "1.23*u - 0.5*(exp(u)-1) + 1.23e+03*u**3"
    assert parse_equation(text, LIB) == pytest.approx({"u": 1.23, "exp(u)-1": -0.5, "u**3": 1230.0})
    assert format_equation({}) == "0"


def test_support_of_a_written_equation_with_or_without_numbers() -> None:
    selection = ["u", "u**3", "sin(u)"]
    assert support_of("0.9*sin(u) - 0.7*u**3", selection, LIB) == ["u**3", "sin(u)"]
    assert support_of("u + u**3", selection, LIB) == ["u", "u**3"]  # no coefficients: the terms named
    assert support_of("1*tanh(u)", selection, LIB) == []  # parsed, but outside the selection


def test_placeholders_are_found_as_words_only() -> None:
    assert symbolic_coefficients("c1*u + alpha*tanh(u) + b*u**3") == ["alpha", "b", "c1"]
    assert symbolic_coefficients("0.5*tanh(u) + 1*exp(u)-1") == []


def test_reaction_and_library_matrix() -> None:
    u = np.array([0.0, 1.0, 2.0])
    # -u + 0.5 u^3 at 1: -0.5; at 2: -2 + 4 = 2
    assert reaction(u, {"u": -1.0, "u**3": 0.5}).tolist() == [0.0, -0.5, 2.0]
    theta, kept = library_matrix(u, ["u**2", "nonsense", "u/(1+u**2)"])
    assert kept == ["u**2", "u/(1+u**2)"]
    assert theta.tolist() == [[0.0, 0.0], [1.0, 0.5], [4.0, 0.4]]
