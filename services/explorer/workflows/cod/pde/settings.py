"""The PDE environment's settings (taskset workflow_args, Trinity's names and defaults) and the state
a pack's tasks share (PdePack: the hidden equation, the simulated trajectories, every dataset sampled,
the last committed conclusion).

workflow_args: pde_state_abs_limit (required, > 0: the state's clip), initial_condition_shape
(required, {mode_count_range: [min, max]}), dictionary_terms (the whole library), min_reaction_terms
(1) and max_reaction_terms (2): the hidden equation's size and the largest support regression
enumerates, ground_truth_family (physical_general.json: families.py), max_steps (10), point_budget (15
points a task), noise_level (0.002: Gaussian noise on sampled u, a quarter of it on y), kappa_threshold
(100), blind_submission_penalty (100: the diagnostic reported when nothing was fitted), pde_grid_size
(257 nodes, odd: an even size gets one more) and pde_time_steps (2001), pack_size (1: the trajectories
of a pack, when the row has no pack_size), dump_trajectories (true) and checkpoint_job_dir.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument
from services.explorer.workflows.cod.pde import families, simulate
from services.explorer.workflows.cod.pde.terms import LIBRARY, reaction

PACK_KEY = "pde_discovery/pack"


def _number(args: dict[str, Any], key: str, default: float | None, *, low: float, strict: bool) -> float:
    if key not in args and default is None:
        raise InvalidArgument(f"{key} is required (a number > {low})", field=f"workflow_args.{key}")
    raw: Any = args.get(key, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < low or (strict and value == low):
        bound = ">" if strict else ">="
        raise InvalidArgument(
            f"{key} must be a finite number {bound} {low}, got {raw!r}",
            field=f"workflow_args.{key}",
        )
    return value


def _whole(args: dict[str, Any], key: str, default: int, low: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < low:
        raise InvalidArgument(
            f"{key} must be a whole number >= {low}, got {value!r}", field=f"workflow_args.{key}"
        )
    return int(value)


@dataclass(frozen=True)
class PdeSettings:
    dictionary: list[str]
    min_terms: int
    max_terms: int
    family: str
    shape: simulate.InitialShape
    limit: float
    max_steps: int
    point_budget: int
    noise: float
    kappa_threshold: float
    blind_penalty: float
    grid_size: int
    time_steps: int
    pack_size: int
    dump: bool
    dump_root: str

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> PdeSettings:
        dictionary = args.get("dictionary_terms", list(LIBRARY))
        unknown = [t for t in dictionary or [] if t not in LIBRARY] if isinstance(dictionary, list) else None
        if not dictionary or unknown:
            raise InvalidArgument(
                f"dictionary_terms must be a non-empty list of library terms ({', '.join(LIBRARY)}); "
                f"not in it: {unknown if unknown else dictionary!r}",
                field="workflow_args.dictionary_terms",
            )
        low = _whole(args, "min_reaction_terms", 1, 1)
        high = _whole(args, "max_reaction_terms", 2, low)
        grid = _whole(args, "pde_grid_size", 257, 17)
        return cls(
            dictionary=list(dict.fromkeys(dictionary)),
            min_terms=low,
            max_terms=high,
            family=str(args.get("ground_truth_family", families.DEFAULT_FAMILY)),
            shape=simulate.InitialShape.from_args(args.get("initial_condition_shape")),
            limit=_number(args, "pde_state_abs_limit", None, low=0.0, strict=True),
            max_steps=_whole(args, "max_steps", 10, 1),
            point_budget=_whole(args, "point_budget", 15, 0),
            noise=_number(args, "noise_level", 0.002, low=0.0, strict=False),
            kappa_threshold=_number(args, "kappa_threshold", 100.0, low=0.0, strict=True),
            blind_penalty=_number(args, "blind_submission_penalty", 100.0, low=0.0, strict=False),
            grid_size=grid + 1 if grid % 2 == 0 else grid,
            time_steps=_whole(args, "pde_time_steps", 2001, 51),
            pack_size=_whole(args, "pack_size", 1, 1),
            dump=bool(args.get("dump_trajectories", True)),
            dump_root=str(args.get("checkpoint_job_dir") or "logs/research_cod/pde_discovery"),
        )

    def term_range(self) -> tuple[int, int]:
        """(min, max) terms of the hidden equation, within the dictionary's size."""
        low = max(1, min(self.min_terms, len(self.dictionary)))
        return low, max(low, min(self.max_terms, len(self.dictionary)))

    def support_size_text(self) -> str:
        low, high = self.term_range()
        return f"exactly {low}" if low == high else f"{low} to {high}"


@dataclass
class PdePack:
    """What a pack's tasks share (module docstring)."""

    equation: dict[str, float]
    template_index: int | None
    environment_seed: int
    trajectories: int
    amplitude_upper: float
    next_position: int = 1
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    samples: int = 0
    fields: dict[str, Any] | None = None
    latest_regression: str = ""
    preferred_equation: str = ""
    preferred_support: list[str] = field(default_factory=list)
    preferred_coefficients: dict[str, float] = field(default_factory=dict)
    last_update: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def simulated(self, settings: PdeSettings) -> dict[str, Any]:
        """The trajectories on the fine grid, simulated on first use."""
        if self.fields is None:
            grid = simulate.Grid(settings.grid_size, settings.time_steps)
            u0 = np.array(
                [
                    simulate.initial_condition(
                        grid.x,
                        self.environment_seed,
                        i,
                        self.trajectories,
                        self.amplitude_upper,
                        settings.shape,
                    )
                    for i in range(self.trajectories)
                ]
            )
            self.fields = simulate.simulate(grid, u0, lambda u: reaction(u, self.equation), settings.limit)
        return self.fields


def open_pack(settings: PdeSettings, raw: dict[str, Any], shared: dict[str, Any]) -> tuple[PdePack, int]:
    """(pack, the task's 1-based position in it). The position is the row's task_idx + 1 (injected by
    the pack run), else the next one of the pack run. Position 1 opens a new pack (its hidden equation
    drawn from pde_environment_seed, else pack_seed, else the row's seed); a later one continues the
    pack the run's earlier tasks opened, at exactly its next position, with the same hidden environment."""
    seed = int(raw.get("pde_environment_seed", raw.get("pack_seed", raw.get("seed", 42))))
    index = raw.get("ground_truth_template_index")
    index = None if index is None else int(index)
    pack: PdePack | None = shared.get(PACK_KEY)
    position = int(raw["task_idx"]) + 1 if "task_idx" in raw else (pack.next_position if pack else 1)
    if position == 1:
        templates = families.load_templates(settings.family, settings.dictionary)
        low, high = settings.term_range()
        upper = families.calibrate_amplitude(templates, low, high, settings.limit)
        count = int(raw.get("pack_size", settings.pack_size))
        if count < 1:
            raise InvalidArgument(f"pack_size must be >= 1, got {count}", field="raw_task.pack_size")

        def stable(coefficients: dict[str, float]) -> bool:
            return families.is_stable(
                coefficients, grid_size=settings.grid_size, time_steps=settings.time_steps, count=count,
                seed=seed, upper=upper, shape=settings.shape, limit=settings.limit,
            )  # fmt: skip

        equation = families.hidden_equation(seed, templates, low, high, index, stable)
        pack = PdePack(equation, index, seed, count, upper)
        shared[PACK_KEY] = pack
    elif pack is None or pack.next_position != position:
        expected = 1 if pack is None else pack.next_position
        raise InvalidArgument(
            f"PDE pack tasks run in order from task_idx 0: this one is at {position - 1}, the pack expects "
            f"{expected - 1}",
            field="raw_task.task_idx",
        )
    elif (index, seed) != (pack.template_index, pack.environment_seed):
        raise InvalidArgument(
            "every task of a PDE pack must share its hidden environment: the same pde_environment_seed, else "
            "pack_seed (cod.cod_workflow_args.inject_pack_seed: true gives one), and ground_truth_template_index",
            field="raw_task.pde_environment_seed",
        )
    pack.next_position = position + 1
    return pack, position
