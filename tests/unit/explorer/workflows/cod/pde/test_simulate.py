"""The hidden PDE's numerics against hand-worked cases: one implicit step of the first sine mode, the
scheme's residual equal to f(u), bilinear interpolation, initial conditions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.explorer.workflows.cod.pde import simulate
from services.explorer.workflows.cod.pde.simulate import Grid, InitialShape


def test_one_implicit_step_of_the_first_sine_mode() -> None:
    # u0 = sin(pi x) on 5 nodes (dx 1/4), dt 1/2, f(u) = a u with a = -1. The 3-point second difference
    # of sin(pi x) is -lambda sin(pi x), lambda = (4 / dx^2) sin^2(pi dx / 2) = 64 sin^2(pi / 8), so the
    # implicit step gives (1 + dt lambda) u1 = (1 + a dt) u0: u1 = u0 * 0.5 / (1 + 32 sin^2(pi / 8)).
    grid = Grid(5, 3)
    u0 = np.sin(np.pi * grid.x)[None, :]
    u0[0, -1] = 0.0
    out = simulate.simulate(grid, u0, lambda u: -1.0 * u, limit=1e9)
    factor = 0.5 / (1 + 32 * math.sin(math.pi / 8) ** 2)
    assert factor == pytest.approx(0.08793, abs=1e-5)
    assert out["u"][0, 1] == pytest.approx(factor * u0[0], abs=1e-12)
    assert out["u"][0, 2] == pytest.approx(factor**2 * u0[0], abs=1e-12)


def test_the_residual_is_the_reaction_where_nothing_is_clipped() -> None:
    grid = Grid(17, 51)
    u0 = np.array([0.8 * np.sin(np.pi * grid.x), 0.3 * np.sin(2 * np.pi * grid.x)])
    u0[:, -1] = 0.0
    out = simulate.simulate(grid, u0, lambda u: -1.5 * u + 0.5 * u**2, limit=3.0)
    u, y = out["u"], out["y"]
    assert y[:, :, 1:-1] == pytest.approx(-1.5 * u[:, :, 1:-1] + 0.5 * u[:, :, 1:-1] ** 2, abs=1e-9)
    assert np.all(y[:, :, [0, -1]] == 0.0) and np.all(u[:, :, [0, -1]] == 0.0)


def test_states_are_clipped_to_the_limit() -> None:
    grid = Grid(17, 51)
    u0 = (2.0 * np.sin(np.pi * grid.x))[None, :]
    free = simulate.simulate(grid, u0, lambda u: 40.0 * u, limit=1e9)
    held = simulate.simulate(grid, u0, lambda u: 40.0 * u, limit=2.5)
    assert np.max(free["u"]) > 100.0 and 2.0 < np.max(held["u"]) <= 2.5


def test_bilinear_interpolation() -> None:
    x, t = np.array([0.0, 0.5, 1.0]), np.array([0.0, 1.0])
    values = np.array([[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]])
    # (0.25, 0.5): x halfway between 0 and 1 (0.5), t halfway between rows -> 0.5 + 5 = 5.5; nodes exact
    got = simulate.interpolate(x, t, values, np.array([0.25, 0.5, 1.0]), np.array([0.5, 0.0, 1.0]))
    assert got.tolist() == pytest.approx([5.5, 1.0, 12.0])


def test_amplitudes_take_one_band_each_and_peak_the_initial_condition() -> None:
    drawn = simulate.amplitudes(seed=11, count=4, upper=2.0)
    assert [math.floor(a / 0.5) for a in sorted(drawn)] == [0, 1, 2, 3]
    x = np.linspace(0.0, 1.0, 33)
    shape = InitialShape(1, 3)
    for i in range(4):
        u0 = simulate.initial_condition(x, 11, i, 4, 2.0, shape)
        assert u0[0] == u0[-1] == 0.0 and np.min(u0) >= 0.0
        assert np.max(u0) == pytest.approx(drawn[i])


def test_initial_shape_is_checked() -> None:
    assert InitialShape.from_args({"mode_count_range": [1, 2]}) == InitialShape(1, 2)
    for bad in (
        None,
        {},
        {"mode_count_range": [2, 1]},
        {"mode_count_range": [0, 2]},
        {"mode_count_range": 3},
    ):
        with pytest.raises(InvalidArgument, match="mode_count_range") as info:
            InitialShape.from_args(bad)
        assert info.value.field == "workflow_args.initial_condition_shape"
