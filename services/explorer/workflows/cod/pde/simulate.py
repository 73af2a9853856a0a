"""The hidden PDE u_t = u_xx + f(u) on x in [0, 1], t in [0, 1], u = 0 at both ends, and what a
sample of it observes.

Scheme (Trinity's): implicit Euler for the diffusion, explicit for the reaction,
    (I - dt D2) u^{n+1} = u^n + dt f(u^n),     D2 the 3-point second difference over dx,
both sides clipped to +-state_abs_limit. The matrix is constant, so it is inverted once and each
step is one product (a batch of trajectories at a time). The observed reaction target is the
scheme's own residual, y^n = (u^{n+1} - u^n) / dt - D2 u^{n+1} (= f(u^n) where nothing was clipped),
and y = f(u) on the last time row, which has no step after it.

Initial conditions (one per trajectory, i.e. per task position of a pack): amplitude A_i drawn in the
i-th of `count` equal bands of (0, amplitude_upper), shuffled; shape sin(pi x) * (m(x) - min m),
m = sum_{k=1..K} c_k sin(k pi x) / max|.|, K uniform in mode_count_range, c_k standard normal,
scaled to peak A_i. Random streams: numpy SeedSequence([seed, stream, ...]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument

Array = np.ndarray
GROUND_TRUTH_STREAM, AMPLITUDE_STREAM, SHAPE_STREAM = 0, 1, 2


@dataclass(frozen=True)
class InitialShape:
    """workflow_args.initial_condition_shape: {mode_count_range: [min, max]} sine modes."""

    low: int
    high: int

    @classmethod
    def from_args(cls, raw: object) -> InitialShape:
        field = "workflow_args.initial_condition_shape"
        if not isinstance(raw, Mapping) or set(raw) != {"mode_count_range"}:
            raise InvalidArgument(
                f"initial_condition_shape must be {{mode_count_range: [min, max]}}, got {raw!r}", field=field
            )
        value = raw["mode_count_range"]
        if isinstance(value, str | bytes) or not hasattr(value, "__len__") or len(value) != 2:
            raise InvalidArgument(f"mode_count_range must be [min, max], got {value!r}", field=field)
        low, high = int(value[0]), int(value[1])
        if low < 1 or high < low:
            raise InvalidArgument(f"mode_count_range needs 1 <= min <= max, got {value!r}", field=field)
        return cls(low, high)


def amplitudes(seed: int, count: int, upper: float) -> list[float]:
    """One amplitude per trajectory, from equal bands of (0, upper), in shuffled order."""
    edges = np.linspace(0.0, upper, max(1, count) + 1)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), AMPLITUDE_STREAM]))
    drawn = [float(rng.uniform(edges[i], edges[i + 1])) for i in range(len(edges) - 1)]
    rng.shuffle(drawn)
    return drawn


def initial_condition(
    x: Array, seed: int, index: int, count: int, upper: float, shape: InitialShape
) -> Array:
    """u(x, 0) of trajectory `index` of `count` (module docstring)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), SHAPE_STREAM, int(index)]))
    amplitude = amplitudes(seed, count, upper)[index]
    coordinate = (x - x[0]) / (x[-1] - x[0])
    modes_n = int(rng.integers(shape.low, shape.high + 1))
    modes = np.zeros_like(x, dtype=float)
    for k, c in enumerate(rng.normal(size=modes_n), start=1):
        modes += c * np.sin(k * np.pi * coordinate)
    peak = float(np.max(np.abs(modes)))
    modes = modes / peak if peak > 1e-12 else modes
    profile = np.sin(np.pi * coordinate) * (modes - float(np.min(modes)))
    u0 = amplitude * profile / max(float(np.max(profile)), 1e-12)
    u0[0] = u0[-1] = 0.0
    return u0


class Grid:
    """nx x nt nodes on [0, 1]^2 and the implicit diffusion step on them."""

    def __init__(self, nx: int, nt: int) -> None:
        self.x = np.linspace(0.0, 1.0, nx)
        self.t = np.linspace(0.0, 1.0, nt)
        self.dx, self.dt = 1.0 / (nx - 1), 1.0 / (nt - 1)
        r = self.dt / self.dx**2
        inner = nx - 2
        matrix = (1.0 + 2.0 * r) * np.eye(inner) - r * (np.eye(inner, k=1) + np.eye(inner, k=-1))
        self.inverse = np.linalg.inv(matrix)  # symmetric: rows or columns alike

    def step(self, rhs: Array) -> Array:
        """u^{n+1} at the interior nodes from u^n + dt f(u^n) there ([..., nx - 2])."""
        return np.asarray(rhs @ self.inverse)


def second_difference(u: Array, dx: float) -> Array:
    """D2 u along the last axis at interior nodes; the end columns copy their neighbours."""
    out = np.zeros_like(u)
    out[..., 1:-1] = (u[..., 2:] - 2.0 * u[..., 1:-1] + u[..., :-2]) / dx**2
    out[..., 0], out[..., -1] = out[..., 1], out[..., -2]
    return out


def simulate(grid: Grid, u0: Array, reaction: Callable[[Array], Array], limit: float) -> dict[str, Any]:
    """Trajectories from initial states u0 [T, nx]: fields u and y [T, nt, nx] (module docstring)."""
    count, nt, nx = u0.shape[0], len(grid.t), len(grid.x)
    u = np.zeros((count, nt, nx))
    u[:, 0] = u0
    u[:, :, 0] = u[:, :, -1] = 0.0
    for n in range(nt - 1):
        inner = u[:, n, 1:-1]
        rhs = np.clip(inner + grid.dt * reaction(inner), -limit, limit)
        u[:, n + 1, 1:-1] = np.clip(grid.step(rhs), -limit, limit)
    y = np.zeros_like(u)
    y[:, :-1, 1:-1] = (u[:, 1:, 1:-1] - u[:, :-1, 1:-1]) / grid.dt - second_difference(u[:, 1:], grid.dx)[
        :, :, 1:-1
    ]
    y[:, -1, 1:-1] = reaction(u[:, -1, 1:-1])
    return {"x": grid.x, "t": grid.t, "u": u, "y": y}


def interpolate(x_grid: Array, t_grid: Array, values: Array, x: Array, t: Array) -> Array:
    """Bilinear interpolation of values [nt, nx] at the points (x_i, t_i)."""
    xi = np.clip(np.searchsorted(x_grid, x, side="right") - 1, 0, len(x_grid) - 2)
    ti = np.clip(np.searchsorted(t_grid, t, side="right") - 1, 0, len(t_grid) - 2)
    wx = (x - x_grid[xi]) / np.maximum(x_grid[xi + 1] - x_grid[xi], 1e-12)
    wt = (t - t_grid[ti]) / np.maximum(t_grid[ti + 1] - t_grid[ti], 1e-12)
    low = (1.0 - wx) * values[ti, xi] + wx * values[ti, xi + 1]
    high = (1.0 - wx) * values[ti + 1, xi] + wx * values[ti + 1, xi + 1]
    return np.asarray((1.0 - wt) * low + wt * high)
