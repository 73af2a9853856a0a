"""The hidden equations a pack may get: a family of templates, and the draw of one equation.

A family is a JSON file, {"templates": [{"terms": [...], "signs": {term: +1 | -1}}, ...]} (or the
bare list), the format of Trinity's ground_truth_families/*.json. workflow_args.ground_truth_family
names a family bundled here (families/, by file name, `.json` optional) or gives the path of a JSON
file. Trinity's own files (physical_general.json, its default, physical_full_train.json, ...) are not
shipped with this project: copy one from Trinity-RFT and give its path. Terms outside the task's
dictionary_terms are left out of a template (a template left empty is skipped); a sign not given is +1.

The draw (Trinity's, so a pack seed gives the same equation as there): rng = numpy
default_rng(SeedSequence([environment seed, 0])); among the templates with min..max terms, the row's
ground_truth_template_index or rng.integers; each term gets sign * round(uniform(0.5, 2.0), 2). A draw
is kept when every trajectory of the pack stays inside +-state_abs_limit on a coarse grid (<= 65 x 401
nodes); after 128 unstable draws the last one is used.

Initial amplitudes are bounded by one value per family (calibrate_amplitude): the largest amplitude,
found by bisection on (0, limit) to limit / 64, at which u0 = A sin(pi x) stays inside the limit for
400 steps on a 65-node grid under every corner of every eligible template's coefficient box
(|c| in {0.5, 2.0}, the template's signs).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.common.errors import InvalidArgument
from services.common.logging import get_logger
from services.explorer.workflows.cod.pde import simulate
from services.explorer.workflows.cod.pde.terms import LIBRARY, basis

BUNDLED = Path(__file__).parent / "families"
DEFAULT_FAMILY = "physical_general.json"  # Trinity's default name; not bundled (module docstring)
MAGNITUDE = (0.5, 2.0)
MAX_DRAWS = 128
COARSE_NX, COARSE_NT = 65, 401
FIELD = "workflow_args.ground_truth_family"
TRINITY_FOLDER = "trinity/common/workflows/connect_the_dots/pde_discovery/ground_truth_families/"

log = get_logger("explorer.workflows.cod.pde.families")


@dataclass(frozen=True)
class Template:
    terms: tuple[str, ...]
    signs: tuple[float, ...]  # +-1 per term


def family_path(name: str) -> Path:
    """The file a ground_truth_family names (module docstring); InvalidArgument when there is none."""
    text = str(name).strip()
    if "/" in text or text.startswith("."):
        path = Path(text).expanduser()
    else:
        stem = text.removesuffix(".json")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", stem):
            raise InvalidArgument(
                f"ground_truth_family {name!r} is neither a family name nor a path", field=FIELD
            )
        path = BUNDLED / f"{stem}.json"
    if path.is_file():
        return path
    bundled = ", ".join(sorted(p.name for p in BUNDLED.glob("*.json")))
    raise InvalidArgument(
        f"{name!r} does not exist here (bundled: {bundled}); Trinity's family files are not shipped with this "
        f"project: copy it from Trinity-RFT's {TRINITY_FOLDER} and give its path",
        field=FIELD,
    )


def load_templates(name: str, dictionary: list[str]) -> list[Template]:
    """The family's templates over `dictionary` (module docstring)."""
    path = family_path(name)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"ground_truth_family {path} is not JSON: {exc}", field=FIELD) from exc
    raw = payload.get("templates") if isinstance(payload, dict) else payload
    if not isinstance(raw, list):
        raise InvalidArgument(f"ground_truth_family {path} has no template list", field=FIELD)
    templates = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("terms"), list):
            raise InvalidArgument(
                f"{path}: template {i} is not {{terms: [...], signs: {{...}}}}", field=FIELD
            )
        unknown = [t for t in entry["terms"] if t not in LIBRARY]
        if unknown:
            raise InvalidArgument(
                f"{path}: template {i} names terms outside the library: {unknown}", field=FIELD
            )
        terms = tuple(dict.fromkeys(t for t in entry["terms"] if t in dictionary))
        if terms:
            signs = dict(entry.get("signs") or {})
            templates.append(
                Template(terms, tuple(1.0 if float(signs.get(t, 1.0)) >= 0 else -1.0 for t in terms))
            )
    if not templates:
        raise InvalidArgument(f"{path} has no template over the dictionary_terms {dictionary}", field=FIELD)
    return templates


def eligible(templates: list[Template], low: int, high: int) -> list[Template]:
    chosen = [t for t in templates if low <= len(t.terms) <= high]
    if not chosen:
        raise InvalidArgument(
            f"the ground_truth_family has no template of {low} to {high} terms "
            "(workflow_args.min_reaction_terms / max_reaction_terms)",
            field=FIELD,
        )
    return chosen


def _stays_bounded(
    grid: simulate.Grid,
    u0: np.ndarray,
    coefficients: np.ndarray,
    terms: list[str],
    limit: float,
    *,
    bound_rhs: bool,
) -> bool:
    """Every row i of u0 [R, nx] under f_i(u) = sum_k coefficients[i, k] phi_k(u) stays finite and its
    states inside +-limit for nt - 1 steps, unclipped (with bound_rhs, u + dt f(u) too)."""
    state = u0[:, 1:-1].copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(len(grid.t) - 1):
            f = sum(coefficients[:, [k]] * basis(term, state) for k, term in enumerate(terms))
            rhs = state + grid.dt * f
            if not np.all(np.isfinite(rhs)) or (bound_rhs and np.any(np.abs(rhs) >= limit)):
                return False
            state = grid.step(rhs)
            if not np.all(np.isfinite(state)) or np.any(np.abs(state) >= limit):
                return False
    return True


@functools.lru_cache(maxsize=32)
def _calibrated(templates: tuple[Template, ...], limit: float) -> float:
    terms = sorted({t for tpl in templates for t in tpl.terms}, key=LIBRARY.index)
    corners = []
    for tpl in templates:
        for magnitudes in itertools.product(MAGNITUDE, repeat=len(tpl.terms)):
            row = np.zeros(len(terms))
            for term, sign, magnitude in zip(tpl.terms, tpl.signs, magnitudes, strict=True):
                row[terms.index(term)] = sign * magnitude
            corners.append(row)
    grid = simulate.Grid(COARSE_NX, COARSE_NT)
    coefficients = np.array(corners)
    profile = np.sin(np.pi * grid.x)
    safe, unsafe = 0.0, limit
    while unsafe - safe > limit / (COARSE_NX - 1):
        middle = (safe + unsafe) / 2.0
        u0 = np.repeat((middle * profile)[None, :], len(corners), axis=0)
        if _stays_bounded(grid, u0, coefficients, terms, limit, bound_rhs=False):
            safe = middle
        else:
            unsafe = middle
    if safe <= 0.0:
        raise InvalidArgument(
            f"no initial amplitude keeps this ground_truth_family inside pde_state_abs_limit {limit}",
            field=FIELD,
        )
    return safe


def calibrate_amplitude(templates: list[Template], low: int, high: int, limit: float) -> float:
    """The family's initial-amplitude bound (module docstring), cached per family and limit."""
    return _calibrated(tuple(eligible(templates, low, high)), float(limit))


def draw(
    rng: np.random.Generator, templates: list[Template], low: int, high: int, index: int | None
) -> dict[str, float]:
    """One hidden equation {term: coefficient}, terms in library order (module docstring)."""
    pool = eligible(templates, low, high)
    if index is None:
        template = pool[int(rng.integers(0, len(pool)))]
    elif 0 <= index < len(pool):
        template = pool[index]
    else:
        raise InvalidArgument(
            f"ground_truth_template_index {index} is outside the eligible templates [0, {len(pool) - 1}]",
            field="raw_task.ground_truth_template_index",
        )
    sign_of = dict(zip(template.terms, template.signs, strict=True))
    coefficients = {}
    for term in sorted(template.terms, key=LIBRARY.index):
        sign = sign_of[term]
        magnitude = round(float(rng.uniform(*MAGNITUDE)), 2)
        coefficients[term] = sign * magnitude
    return coefficients


def is_stable(
    coefficients: dict[str, float],
    *,
    grid_size: int,
    time_steps: int,
    count: int,
    seed: int,
    upper: float,
    shape: simulate.InitialShape,
    limit: float,
) -> bool:
    """Every trajectory of the pack stays inside +-limit on the coarse grid (module docstring)."""
    grid = simulate.Grid(max(17, min(grid_size, COARSE_NX)), max(17, min(time_steps, COARSE_NT)))
    u0 = np.array([simulate.initial_condition(grid.x, seed, i, count, upper, shape) for i in range(count)])
    terms = list(coefficients)
    row = np.array([[coefficients[t] for t in terms]] * count)
    return _stays_bounded(grid, u0, row, terms, limit, bound_rhs=True)


def hidden_equation(
    seed: int,
    templates: list[Template],
    low: int,
    high: int,
    index: int | None,
    stable: Callable[[dict[str, float]], bool],
) -> dict[str, float]:
    """The pack's hidden f(u): the first draw of the seed's stream that `stable` accepts (module docstring)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), simulate.GROUND_TRUTH_STREAM]))
    coefficients: dict[str, float] = {}
    for _ in range(MAX_DRAWS):
        coefficients = draw(rng, templates, low, high, index)
        if stable(coefficients):
            return coefficients
    log.warning("pde_no_stable_reaction", draws=MAX_DRAWS, using="the last draw")
    return coefficients
