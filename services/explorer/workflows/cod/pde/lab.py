"""One task's PDE lab: the four actions an agent calls, each returning (feedback, task over?, format
error?). A refused call (bad arguments, budget exceeded, an equation that was never scored) is
feedback and the task goes on; an unknown action or arguments that are not a set of fields end it as
a format error.

- sample_pde_data(point_grid): u and y at chosen (x, t), 0 < x < 1, 0 <= t <= 1, on this task's
  trajectory (pack position p uses trajectory (p - 1) mod pack_size), interpolated bilinearly from the
  fine grid, noise N(0, noise_level) on u and N(0, noise_level / 4) on y (numpy SeedSequence([row seed,
  p, sample number])); at most the remaining point budget. Stored for the pack as ds_t<p>_<k>.
- run_sparse_regression(dataset_id = merged_all, dictionary | candidate_equations (<= 8), alpha,
  threshold = 0.05): regression.py on a dataset, merged_all (every one of the pack), or
  merged_t<a>_t<b> (those sampled at positions a..b).
- summarize_pack_evidence(reveal_equations = false): the hypotheses earlier tasks committed.
- update_scientific_context(preferred_equation, note, uncertain_terms (<= 4)): needs this task's own
  sample and regression; the equation must equal (coefficients within 1e-9) one the latest regression
  scored. It ends the task and sets the reward, from the hidden equation c*: loss = sum_k |c_k - c*_k|
  / sum_k |c*_k| + max(0, |support| - |support*|), reward 1 / (1 + loss).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from services.explorer.workflows.cod.pde import regression, simulate
from services.explorer.workflows.cod.pde.settings import PdePack, PdeSettings
from services.explorer.workflows.cod.pde.terms import (
    parse_equation,
    reaction,
    support_of,
    symbolic_coefficients,
)

Outcome = tuple[str, bool, bool]
MAX_CANDIDATES, MAX_UNCERTAIN = 8, 4


def hidden_reward(
    predicted: dict[str, float], target: dict[str, float], library: list[str]
) -> dict[str, float]:
    """The committed equation's reward against the hidden one (module docstring)."""
    l1 = sum(abs(predicted.get(t, 0.0) - target.get(t, 0.0)) for t in library)
    normalized = l1 / max(1e-8, sum(abs(v) for v in target.values()))
    extra = float(max(0, sum(1 for v in predicted.values() if abs(v) > 1e-12) - len(target)))
    loss = normalized + extra
    return {"l1": normalized, "extra_support": extra, "loss": loss, "reward": 1.0 / (1.0 + loss)}


def grid_points(raw: object) -> list[tuple[float, float]] | None:
    """The (x, t) pairs of a parsed <point_grid>, None when any is missing, not a number or out of range."""
    points = raw.get("point") if isinstance(raw, dict) else None
    points = [points] if isinstance(points, dict) else points
    if not isinstance(points, list) or not points:
        return None
    try:
        pairs = [(float(p["x"]), float(p["t"])) for p in points]
    except (KeyError, TypeError, ValueError):
        return None
    if not all(0.0 < x < 1.0 and 0.0 <= t <= 1.0 for x, t in pairs):
        return None
    return pairs


def coverage(data: dict[str, Any]) -> str:
    u, x, t = data["u"], data["x"], data["t"]
    if not len(u):
        return "empty dataset"
    return f"n={len(u)}; u=[{np.min(u):.3g},{np.max(u):.3g}]; x_span={np.ptp(x):.3g}; t_span={np.ptp(t):.3g}"


class PdeLab:
    """The environment of one task (module docstring); `pack` is shared with the pack's other tasks."""

    def __init__(self, settings: PdeSettings, pack: PdePack, *, position: int, seed: int) -> None:
        self.settings, self.pack, self.position, self.seed = settings, pack, position, seed
        self.trajectory = (position - 1) % pack.trajectories
        self.budget = settings.point_budget
        self.sampled = self.regressed = self.committed = False
        self.last_max_error: float | None = None
        self.last_dataset, self.last_selection = "merged_all", list(settings.dictionary)
        self.last_scored: list[dict[str, Any]] = []
        self.reward = 0.0
        self.scores: dict[str, float] = {}

    def act(self, action: str, args: object) -> Outcome:
        if not isinstance(args, dict):
            return "Invalid action arguments: expected named fields. Game over.", True, True
        handler = {
            "sample_pde_data": self.sample,
            "summarize_pack_evidence": self.summarize,
            "run_sparse_regression": self.regress,
            "update_scientific_context": self.commit,
        }.get(action)
        if handler is None:
            return f"Invalid action: unknown action {action!r}. Game over.", True, True
        return handler(args)

    # --- sampling -------------------------------------------------------------------------------

    def sample(self, args: dict[str, Any]) -> Outcome:
        if args.get("points") is not None or args.get("point_grid") is None:
            return (
                "Error: sample_pde_data takes a point_grid only, one <point x=... t=.../> per (x, t) pair.",
                False,
                False,
            )
        pairs = grid_points(args["point_grid"])
        if pairs is None:
            return (
                "Error: every point of point_grid needs numbers x and t with 0 < x < 1 and 0 <= t <= 1.",
                False,
                False,
            )
        if len(pairs) > self.budget:
            return f"Error: {len(pairs)} points asked for, {self.budget} left in the budget.", False, False
        self.pack.samples += 1
        name = f"ds_t{self.position}_{self.pack.samples}"
        fields = self.pack.simulated(self.settings)
        x, t = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.position, self.pack.samples]))
        u = simulate.interpolate(fields["x"], fields["t"], fields["u"][self.trajectory], x, t)
        y = simulate.interpolate(fields["x"], fields["t"], fields["y"][self.trajectory], x, t)
        u = u + rng.normal(0.0, self.settings.noise, len(x))
        y = y + rng.normal(0.0, self.settings.noise * 0.25, len(x))
        data = {"x": x, "t": t, "u": u, "y": y, "position": self.position}
        self.pack.datasets[name] = data
        self.budget -= len(pairs)
        self.sampled = True
        return (
            f"Sampled {len(pairs)} points as dataset {name}. Point budget left: {self.budget}/"
            f"{self.settings.point_budget}. Region: x in [{x.min():.3g}, {x.max():.3g}], t in [{t.min():.3g}, "
            f"{t.max():.3g}]; mean t {t.mean():.3g}. Coverage: {coverage(data)}.",
            False,
            False,
        )

    def dataset(self, name: str) -> dict[str, Any] | None:
        """A stored dataset, or several merged: merged_all / merged, merged_t<a>_t<b> (module docstring)."""
        stored = self.pack.datasets
        if name in stored:
            return stored[name]
        if name in ("merged_all", "merged"):
            names = sorted(stored)
        elif span := re.fullmatch(r"merged_t(\d+)_t(\d+)", name):
            low, high = int(span.group(1)), int(span.group(2))
            names = [n for n, d in stored.items() if low <= d["position"] <= high]
        else:
            return None
        if not names:
            return None
        return {k: np.concatenate([stored[n][k] for n in names]) for k in ("x", "t", "u", "y")}

    # --- regression -----------------------------------------------------------------------------

    def regress(self, args: dict[str, Any]) -> Outcome:
        name = str(args.get("dataset_id", "merged_all"))
        data = self.dataset(name)
        if data is None:
            return f"Error: dataset_id {name!r} was not found.", False, False
        library = self.settings.dictionary
        raw_terms, raw_candidates = args.get("dictionary"), args.get("candidate_equations")
        candidates = raw_candidates if isinstance(raw_candidates, list) and raw_candidates else None
        if candidates is not None and len(candidates) > MAX_CANDIDATES:
            return f"Error: at most {MAX_CANDIDATES} candidate_equations.", False, False
        if raw_terms is None and candidates is None:
            return "Error: run_sparse_regression needs a dictionary or candidate_equations.", False, False
        if raw_terms is not None and (not isinstance(raw_terms, list) or not raw_terms):
            return "Error: dictionary must be a non-empty list of library terms.", False, False
        selection = [t for t in library if t in {str(r) for r in raw_terms}] if raw_terms else list(library)
        if raw_terms is not None and not selection:
            return "Error: dictionary names none of the library's terms.", False, False
        supports = None
        if candidates is not None:
            written = [str(c).strip() for c in candidates if str(c).strip()]
            supports = [s for s in (support_of(c, selection, library) for c in written) if s]
            if not supports:
                return "Error: candidate_equations use none of the selected library terms.", False, False
            if raw_terms is None:
                selection = [t for t in library if any(t in s for s in supports)]
        try:
            alpha = float(0.05 if args.get("alpha") is None else args["alpha"])
            threshold = float(0.05 if args.get("threshold") is None else args["threshold"])
        except (TypeError, ValueError):
            return "Error: alpha and threshold must be numbers.", False, False
        if not all(math.isfinite(v) and v >= 0.0 for v in (alpha, threshold)):
            return "Error: alpha and threshold must be finite and >= 0.", False, False
        result = regression.sparse_regression(
            data["u"], data["y"], selection, threshold=threshold, max_terms=self.settings.max_terms,
            kappa_threshold=self.settings.kappa_threshold, blind_penalty=self.settings.blind_penalty,
            supports=supports,
        )  # fmt: skip
        ignored = sorted({str(r) for r in raw_terms or []} - set(library))
        self.last_max_error = float(result["max_error"])
        self.last_dataset, self.last_selection, self.last_scored = name, selection, result["scored"]
        self.pack.latest_regression = result["equation"]
        self.regressed = True
        return (
            result["feedback"]
            + (f" Ignored, not library terms: {', '.join(ignored)}." if ignored else "")
            + f" Data fitted: {coverage(data)}. These numbers describe the sampled data only: a local fit and "
            "conditioning check before committing an equation. "
            + self.point_errors(data, result["coefficients"]),
            False,
            False,
        )

    def point_errors(self, data: dict[str, Any], coefficients: dict[str, float]) -> str:
        predicted = reaction(data["u"], coefficients)
        rows = [
            f"(x={x:.4g}, t={t:.4g}, u={u:.4g}, y={y:.4g}, pred={p:.4g}, abs_error={abs(y - p):.4g})"
            for x, t, u, y, p in zip(data["x"], data["t"], data["u"], data["y"], predicted, strict=True)
        ]
        return "Errors at the sampled points: " + "; ".join(rows) + "."

    # --- the pack's evidence and the commitment -------------------------------------------------

    def summarize(self, args: dict[str, Any]) -> Outcome:
        reveal = str(args.get("reveal_equations", "false")).lower()
        if reveal not in ("true", "false"):
            return "Error: reveal_equations must be true or false.", False, False
        slots: dict[str, set[int]] = {}
        for entry in self.pack.history:
            if entry["equation"]:
                slots.setdefault(entry["equation"], set()).add(entry["position"])
        if not slots:
            return (
                "Pack evidence: no earlier task of this pack committed a hypothesis yet; start from this "
                "task's own measurements.",
                False,
                False,
            )
        lines = ["Pack evidence (hypotheses earlier tasks committed, not the truth):"]
        for i, (equation, positions) in enumerate(slots.items(), start=1):
            shown = f"; recorded equation {equation}" if reveal == "true" else ""
            lines.append(f"H{i}: tasks {','.join(str(p) for p in sorted(positions))}{shown}.")
        if reveal == "false":
            lines.append("Call it with reveal_equations true to see the recorded equations themselves.")
        return "\n".join(lines), False, False

    def commit(self, args: dict[str, Any]) -> Outcome:
        library = self.settings.dictionary
        equation = str(args.get("preferred_equation", "") or "").strip()
        note = re.sub(r"\s+", " ", str(args.get("note", "") or "")).strip()
        uncertain = args.get("uncertain_terms", [])
        uncertain = uncertain if isinstance(uncertain, list) else [uncertain]
        if len(uncertain) > MAX_UNCERTAIN:
            return f"Error: at most {MAX_UNCERTAIN} uncertain_terms.", False, False
        uncertain = [re.sub(r"\s+", " ", str(u)).strip() for u in uncertain if str(u or "").strip()]
        if not equation:
            return (
                "Error: update_scientific_context needs a preferred_equation: an equation the latest "
                "run_sparse_regression scored (its best fit or another candidate).",
                False,
                False,
            )
        if symbols := symbolic_coefficients(equation):
            return (
                f"Error: preferred_equation has placeholder coefficients ({', '.join(symbols)}); give the numbers "
                "of a scored candidate.",
                False,
                False,
            )
        if not self.sampled:
            return (
                "Error: sample data in this task (sample_pde_data) before committing a conclusion.",
                False,
                False,
            )
        if not self.regressed:
            return (
                "Error: run run_sparse_regression in this task before committing a conclusion.",
                False,
                False,
            )
        coefficients = parse_equation(equation, library)
        if not coefficients:
            return (
                "Error: preferred_equation does not parse: write numeric coefficients times library terms, "
                "e.g. 1.2*u - 0.8*u**3.",
                False,
                False,
            )
        if not any(self._same(coefficients, e["coefficients"]) for e in self.last_scored):
            return (
                "Error: preferred_equation must be one the latest run_sparse_regression scored.",
                False,
                False,
            )
        data = self.dataset(self.last_dataset) or self.dataset("merged_all")
        assert data is not None  # the regression just ran on it
        found = regression.candidate_diagnostics(
            equation, data["u"], data["y"], self.last_selection, library, self.last_scored,
            self.settings.kappa_threshold,
        )  # fmt: skip
        self.scores = hidden_reward(coefficients, self.pack.equation, library)
        self.reward, self.committed, self.last_max_error = self.scores["reward"], True, found["max_error"]
        pack = self.pack
        pack.preferred_equation, pack.preferred_support = equation, found["support"]
        pack.preferred_coefficients = dict(found["coefficients"])
        u = data["u"][np.isfinite(data["u"])]
        evidence = {
            "points": len(u),
            "u_span": float(np.ptp(u)) if len(u) else 0.0,
            "max_error": found["max_error"],
            "relative_margin": found["relative_margin"],
        }
        pack.last_update = {"evidence": evidence, "note": note, "uncertain_terms": uncertain}
        pack.history = [*pack.history, {"position": self.position, "equation": equation}][
            -pack.trajectories :
        ]
        return (
            f"Task over. Committed equation {equation}; sampled-data max error {found['max_error']:.3g}; "
            f"condition penalty {found['condition_penalty']:.3g}; closest equation with a different support "
            f"{found['rival_equation']}; relative margin {found['relative_margin']:.3g}.",
            True,
            False,
        )

    def _same(self, one: dict[str, float], other: dict[str, float]) -> bool:
        return all(
            math.isclose(one.get(t, 0.0), other.get(t, 0.0), rel_tol=1e-9, abs_tol=1e-12)
            for t in self.settings.dictionary
        )
