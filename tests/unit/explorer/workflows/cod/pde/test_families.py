"""Families of hidden equations: finding and reading one, drawing an equation (Trinity's random stream),
the amplitude bound and the stability check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.explorer.workflows.cod.pde import families
from services.explorer.workflows.cod.pde.simulate import InitialShape
from services.explorer.workflows.cod.pde.terms import LIBRARY

LIB = list(LIBRARY)


def family(tmp_path: Path, templates: list[dict]) -> str:
    path = tmp_path / "fam.json"
    path.write_text(json.dumps({"templates": templates}))
    return str(path)


def test_a_bundled_family_by_name_or_a_file_by_path(tmp_path: Path) -> None:
    assert families.family_path("small_demo") == families.family_path("small_demo.json")
    assert len(families.load_templates("small_demo.json", LIB)) == 6
    templates = families.load_templates(
        family(tmp_path, [{"terms": ["u", "u**3"], "signs": {"u**3": -1}}]), LIB
    )
    assert templates == [families.Template(("u", "u**3"), (1.0, -1.0))]  # a sign not given is +1


def test_trinitys_own_family_names_are_not_shipped_and_say_where_they_are() -> None:
    with pytest.raises(InvalidArgument, match="'physical_full_train.json' does not exist here") as info:
        families.load_templates("physical_full_train.json", LIB)
    assert info.value.field == "workflow_args.ground_truth_family"
    assert families.TRINITY_FOLDER in info.value.message and "small_demo.json" in info.value.message


def test_bad_families_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="outside the library"):
        families.load_templates(family(tmp_path, [{"terms": ["u**6"]}]), LIB)
    with pytest.raises(InvalidArgument, match="no template over the dictionary_terms"):
        families.load_templates(family(tmp_path, [{"terms": ["u**3"]}]), ["u"])
    with pytest.raises(InvalidArgument, match="neither a family name nor a path"):
        families.family_path("bad name!")
    # a term outside the task's dictionary is left out of its template
    got = families.load_templates(family(tmp_path, [{"terms": ["u", "u**3"]}]), ["u"])
    assert got == [families.Template(("u",), (1.0,))]


def test_a_draw_follows_trinitys_random_stream() -> None:
    templates = [families.Template(("u**3", "u"), (-1.0, 1.0)), families.Template(("tanh(u)",), (-1.0,))]
    rng = np.random.default_rng(np.random.SeedSequence([7, 0]))
    drawn = families.draw(rng, templates, 1, 2, None)
    # the same calls by hand: the template index, then each term's magnitude in library order
    mirror = np.random.default_rng(np.random.SeedSequence([7, 0]))
    chosen = templates[int(mirror.integers(0, 2))]
    expected = {}
    for term in sorted(chosen.terms, key=LIB.index):
        sign = dict(zip(chosen.terms, chosen.signs, strict=True))[term]
        expected[term] = sign * round(float(mirror.uniform(0.5, 2.0)), 2)
    assert drawn == expected and list(drawn) == sorted(drawn, key=LIB.index)
    assert all(0.5 <= abs(c) <= 2.0 and round(c, 2) == c for c in drawn.values())
    fixed = families.draw(np.random.default_rng(0), templates, 1, 2, 1)
    assert list(fixed) == ["tanh(u)"] and fixed["tanh(u)"] < 0
    with pytest.raises(InvalidArgument, match=r"outside the eligible templates \[0, 0\]"):
        families.draw(np.random.default_rng(0), templates, 2, 2, 1)  # only the two-term one is eligible
    with pytest.raises(InvalidArgument, match="no template of 3 to 3 terms"):
        families.eligible(templates, 3, 3)


def test_the_amplitude_bound_of_a_decaying_family_is_the_limit_less_one_step() -> None:
    # f = c u with c in {0.5, 2}: the sine mode decays (pi^2 > 2), every amplitude below 3 is stable, so
    # bisection on (0, 3) to 3/64 ends at 3 - 3/64
    damped = [families.Template(("u",), (1.0,))]
    assert families.calibrate_amplitude(damped, 1, 2, 3.0) == 3 - 3 / 64
    explosive = [families.Template(("u**3",), (1.0,))]
    assert 0.0 < families.calibrate_amplitude(explosive, 1, 2, 3.0) < 3 - 3 / 64


def test_stability_of_a_drawn_equation() -> None:
    check = {"grid_size": 257, "time_steps": 2001, "count": 2, "seed": 3, "upper": 1.0,
             "shape": InitialShape(1, 2), "limit": 3.0}  # fmt: skip
    assert families.is_stable({"u": -1.0}, **check)
    # u_t = u_xx + 20 u: the first sine mode grows like exp((20 - pi^2) t), past the limit before t = 1
    assert not families.is_stable({"u": 20.0}, **check)
    attempts: list[dict[str, float]] = []

    def stable(coefficients: dict[str, float]) -> bool:
        attempts.append(coefficients)
        return len(attempts) == 3

    drawn = families.hidden_equation(5, [families.Template(("u",), (-1.0,))], 1, 1, None, stable)
    assert len(attempts) == 3 and drawn is attempts[-1]
