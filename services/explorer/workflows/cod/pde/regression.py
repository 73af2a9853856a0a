"""Sparse regression of y ~ f(u) over a selection of library terms (SINDy / PDE-FIND style: Brunton
et al. 2016, arXiv:1509.03580; Rudy et al. 2017, arXiv:1609.06401), with Trinity's scoring.

Supports scored: with `supports` (the agent's candidate equations), exactly those; otherwise every
subset of 1..max_terms of the selected terms whose columns are finite and not all zero. Each support
is fitted by least squares (ridge 1e-8), terms with |c| < threshold dropped and the rest refitted
until all stay; coefficients are rounded to 3 decimals, written as an equation (3 significant digits)
and read back, and that equation is what is scored: its max |y - f(u)| over the data. The best is the
lowest max error. Each support's rival is the lowest-error support with other terms, its relative
margin (e_rival - e) / e (inf when e = 0 < e_rival, 0 when there is no rival).

Conditioning: kappa = s_max / s_min of the support's columns scaled to unit norm (1e12 when
singular); condition penalty = max(0, log10 kappa - log10 kappa_threshold).

`alpha` (the ridge of Trinity's screening pass) is checked but changes nothing: the support that
pass picks is one of the enumerated subsets, as in Trinity.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from services.explorer.workflows.cod.pde.terms import (
    format_equation,
    library_matrix,
    parse_equation,
    reaction,
)

KAPPA_CAP = 1e12
REFIT_RIDGE = 1e-8
NO_RIVAL = "none (no support with other terms was scored)"


def max_abs_error(y: np.ndarray, prediction: np.ndarray) -> float:
    return float(np.max(np.abs(y - prediction))) if len(y) else 1.0


def relative_margin(rival_error: float, error: float) -> float:
    gap = max(0.0, rival_error - error)
    if error > 0.0:
        return gap / error
    return math.inf if gap > 0.0 else 0.0


def effective_kappa(u: np.ndarray, terms: list[str]) -> float:
    """Condition number of the unit-norm columns phi_k(u) (module docstring)."""
    theta, _ = library_matrix(u, terms)
    norms = np.linalg.norm(theta, axis=0)
    theta = theta[:, norms > 1e-12] / norms[norms > 1e-12] if theta.shape[1] else theta
    if theta.shape[1] == 0:
        return KAPPA_CAP
    try:
        singular = np.linalg.svd(theta, compute_uv=False)
    except np.linalg.LinAlgError:
        return KAPPA_CAP
    if singular[-1] <= 1e-12:
        return KAPPA_CAP
    return min(float(singular[0] / singular[-1]), KAPPA_CAP)


def condition_penalty(kappa: float, kappa_threshold: float) -> float:
    return max(0.0, math.log10(kappa) - math.log10(kappa_threshold))


def _with_rivals(scored: list[dict[str, Any]]) -> None:
    for entry in scored:
        rivals = [o for o in scored if set(o["support"]) != set(entry["support"])]
        rival = min(rivals, key=lambda o: o["max_error"]) if rivals else None
        entry["rival_equation"] = rival["equation"] if rival else NO_RIVAL
        entry["rival_error"] = rival["max_error"] if rival else math.nan
        entry["relative_margin"] = relative_margin(rival["max_error"], entry["max_error"]) if rival else 0.0


def sparse_regression(
    u: np.ndarray,
    y: np.ndarray,
    selection: list[str],
    *,
    threshold: float,
    max_terms: int,
    kappa_threshold: float,
    blind_penalty: float,
    supports: list[list[str]] | None = None,
) -> dict[str, Any]:
    """The best fit and every scored support (module docstring). Keys: equation, coefficients,
    max_error, kappa, condition_penalty, relative_margin, rival_equation, rival_error, scored (each
    support: equation, support, coefficients, max_error, condition_penalty, relative_margin,
    rival_equation), library_kappa, feedback (without the per-point table)."""
    theta, terms = library_matrix(u, selection)
    if not terms:
        error = max_abs_error(y, np.zeros_like(y))
        return {
            "equation": "0", "coefficients": {}, "max_error": error + blind_penalty, "scored": [],
            "feedback": "Sparse regression failed: none of the selected terms is finite on this data.",
        }  # fmt: skip
    library_kappa = effective_kappa(u, terms)
    norms = np.linalg.norm(theta, axis=0)
    usable = [i for i in range(len(terms)) if norms[i] > 1e-12]

    def fit(indices: tuple[int, ...]) -> dict[str, Any]:
        kept = list(indices)
        values = np.zeros(0)
        while kept:
            design = theta[:, kept]
            try:
                values = np.linalg.solve(design.T @ design + REFIT_RIDGE * np.eye(len(kept)), design.T @ y)
            except np.linalg.LinAlgError:
                values = np.linalg.lstsq(design, y, rcond=None)[0]
            stay = [i for i, v in zip(kept, values, strict=True) if abs(float(v)) >= threshold]
            if stay == kept:
                break
            kept = stay
        rounded = {terms[i]: round(float(v), 3) for i, v in zip(kept, values, strict=True)} if kept else {}
        read_back = parse_equation(format_equation(rounded), terms)
        coefficients = {t: read_back[t] for t in terms if t in read_back}
        support = list(coefficients)
        kappa = effective_kappa(u, support) if support else library_kappa
        return {
            "equation": format_equation(coefficients), "support": support, "coefficients": coefficients,
            "max_error": max_abs_error(y, reaction(u, coefficients)), "kappa": kappa,
            "condition_penalty": condition_penalty(kappa, kappa_threshold),
        }  # fmt: skip

    if supports is not None:
        index = {terms[i]: i for i in usable}
        candidates = {tuple(sorted({index[t] for t in s if t in index})) for s in supports}
    else:
        cap = max(1, min(max_terms, len(usable)))
        candidates = {c for size in range(1, cap + 1) for c in itertools.combinations(usable, size)}
    scored = [fit(c) for c in sorted(candidates or {()})]
    _with_rivals(scored)
    scored.sort(key=lambda e: e["max_error"])
    best = scored[0]
    mode = "your candidate equations" if supports is not None else "your dictionary"
    rival = best["rival_equation"]
    rival += "" if math.isnan(best["rival_error"]) else f" (max error {best['rival_error']:.3g})"
    note = (
        ""
        if len({frozenset(e["support"]) for e in scored}) > 1
        else " With a single support scored, the relative margin is 0."
    )
    feedback = (
        "Sparse regression (every support refitted by least squares, terms below the coefficient threshold "
        f"dropped). Best fit: f(u) = {best['equation']}; sampled-data max error {best['max_error']:.3g}; "
        f"{len(best['support'])} non-zero terms; coefficient threshold {threshold:.3g}. Selected-support kappa "
        f"{best['kappa']:.3g}, whole-selection kappa {library_kappa:.3g}, condition penalty "
        f"{best['condition_penalty']:.3g}. Closest equation with a different support: {rival}; relative margin "
        f"{best['relative_margin']:.3g}. Scored "
        f"{len(scored)} support(s) from {mode}.{note} This only sets the latest regression candidate; what later "
        "tasks inherit is set by update_scientific_context alone."
    )
    return {**best, "scored": scored, "library_kappa": library_kappa, "feedback": feedback}


def candidate_diagnostics(
    candidate: str,
    u: np.ndarray,
    y: np.ndarray,
    selection: list[str],
    library: list[str],
    scored: list[dict[str, Any]],
    kappa_threshold: float,
) -> dict[str, Any]:
    """How a written equation fits (u, y), with its rival among the last regression's `scored`
    supports. Keys: coefficients, support (its terms within `selection`), max_error, kappa,
    condition_penalty, relative_margin, rival_equation."""
    coefficients = parse_equation(candidate, library)
    support = [t for t in selection if coefficients.get(t, 0.0) != 0.0]
    error = max_abs_error(y, reaction(u, coefficients))
    kappa = effective_kappa(u, support) if support else KAPPA_CAP
    rivals = [e for e in scored if set(e["support"]) != set(support)]
    rival = min(rivals, key=lambda e: e["max_error"]) if rivals else None
    return {
        "coefficients": coefficients,
        "support": support,
        "max_error": error,
        "kappa": kappa,
        "condition_penalty": condition_penalty(kappa, kappa_threshold),
        "relative_margin": relative_margin(rival["max_error"], error) if rival else 0.0,
        "rival_equation": rival["equation"] if rival else NO_RIVAL,
    }
