"""Sparse regression and its scores on data worked by hand: u = [1, 2], y = 2u - 0.5u^2 = [1.5, 2]."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.explorer.workflows.cod.pde import simulate
from services.explorer.workflows.cod.pde.regression import (
    KAPPA_CAP,
    NO_RIVAL,
    candidate_diagnostics,
    effective_kappa,
    relative_margin,
    sparse_regression,
)
from services.explorer.workflows.cod.pde.terms import LIBRARY

U, Y = np.array([1.0, 2.0]), np.array([1.5, 2.0])
SETTINGS = {"max_terms": 2, "kappa_threshold": 100.0, "blind_penalty": 100.0}


def test_every_support_is_scored_and_the_exact_one_wins() -> None:
    # {u}: c = (1*1.5 + 2*2) / (1 + 4) = 1.1, errors |1.5 - 1.1|, |2 - 2.2| -> 0.4
    # {u**2}: c = (1.5 + 4*2) / (1 + 16) = 0.5588 -> 0.559, errors 0.941, 0.236 -> 0.941
    # {u, u**2}: exactly 2 and -0.5, error 0
    result = sparse_regression(U, Y, ["u", "u**2"], threshold=0.05, **SETTINGS)
    assert result["equation"] == "2*u - 0.5*u**2" and result["max_error"] == 0.0
    assert [(e["equation"], round(e["max_error"], 6)) for e in result["scored"]] == [
        ("2*u - 0.5*u**2", 0.0),
        ("1.1*u", 0.4),
        ("0.559*u**2", 0.941),
    ]
    assert result["rival_equation"] == "1.1*u" and result["relative_margin"] == math.inf
    assert result["scored"][1]["relative_margin"] == 0.0  # {u}'s rival, {u, u**2}, does better
    # kappa of the unit columns [1, 2]/sqrt5 and [1, 4]/sqrt17: cosine c = 9 / sqrt85, singular values
    # sqrt(1 +- c), kappa = sqrt((1 + c) / (1 - c)) = 9.11, under the threshold 100: no penalty
    c = 9 / math.sqrt(85)
    assert result["kappa"] == pytest.approx(math.sqrt((1 + c) / (1 - c))) == pytest.approx(9.11, abs=0.01)
    assert result["condition_penalty"] == 0.0
    assert (
        "Best fit: f(u) = 2*u - 0.5*u**2" in result["feedback"]
        and "Scored 3 support(s)" in result["feedback"]
    )


def test_a_term_under_the_threshold_is_dropped_and_the_rest_refitted() -> None:
    # threshold 1: {u, u**2} fits -0.5 for u**2, dropped; u refitted alone: 1.1 (error 0.4). {u**2}'s
    # 0.559 is dropped too, leaving f = 0 (error max|y| = 2)
    result = sparse_regression(U, Y, ["u", "u**2"], threshold=1.0, **SETTINGS)
    assert result["equation"] == "1.1*u" and result["max_error"] == pytest.approx(0.4)
    assert [(e["equation"], e["max_error"]) for e in result["scored"]][2] == ("0", 2.0)
    assert [e["support"] for e in result["scored"]] == [["u"], ["u"], []]
    assert result["relative_margin"] == pytest.approx((2.0 - 0.4) / 0.4)  # the rival has other terms


def test_candidate_equations_restrict_the_supports() -> None:
    result = sparse_regression(U, Y, ["u", "u**2"], threshold=0.05, supports=[["u**2"]], **SETTINGS)
    assert result["equation"] == "0.559*u**2" and len(result["scored"]) == 1
    assert result["rival_equation"] == NO_RIVAL and result["relative_margin"] == 0.0
    assert "With a single support scored, the relative margin is 0." in result["feedback"]


def test_at_most_max_terms_are_enumerated() -> None:
    result = sparse_regression(U, Y, ["u", "u**2", "u**3"], threshold=0.05, **{**SETTINGS, "max_terms": 1})
    assert sorted(len(e["support"]) for e in result["scored"]) == [1, 1, 1]


def test_the_regression_recovers_the_hidden_rate_of_a_simulated_pde() -> None:
    # u_t = u_xx - 1.5 u from a sine bump: y = f(u) at the nodes, so y ~ c u gives c = -1.5
    grid = simulate.Grid(17, 51)
    u0 = (0.9 * np.sin(np.pi * grid.x))[None, :]
    u0[0, -1] = 0.0
    out = simulate.simulate(grid, u0, lambda u: -1.5 * u, limit=3.0)
    u, y = out["u"][0, ::10, 1:-1].ravel(), out["y"][0, ::10, 1:-1].ravel()
    result = sparse_regression(u, y, ["u", "u**3", "sin(u)"], threshold=0.05, **SETTINGS)
    assert result["equation"] == "-1.5*u" and result["max_error"] < 1e-9


def test_kappa_and_margin_edge_cases() -> None:
    assert effective_kappa(U, ["u"]) == pytest.approx(1.0)
    assert effective_kappa(U, ["u", "u"]) == KAPPA_CAP  # identical columns
    assert effective_kappa(np.zeros(3), ["u"]) == KAPPA_CAP
    assert relative_margin(0.3, 0.1) == pytest.approx(2.0) and relative_margin(0.0, 0.0) == 0.0
    assert relative_margin(0.05, 0.1) == 0.0


def test_candidate_diagnostics_of_a_written_equation() -> None:
    scored = sparse_regression(U, Y, ["u", "u**2"], threshold=0.05, **SETTINGS)["scored"]
    found = candidate_diagnostics("1.1*u", U, Y, ["u", "u**2"], list(LIBRARY), scored, 100.0)
    assert found["support"] == ["u"] and found["max_error"] == pytest.approx(0.4)
    # its rival is the best other support, {u, u**2} at 0: no margin
    assert found["rival_equation"] == "2*u - 0.5*u**2" and found["relative_margin"] == 0.0
