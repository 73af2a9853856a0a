"""`cod_grid_navigation_workflow`: rook moves over a hidden cost map that a pack's tasks share.

Trinity's CoDGridNavigationWorkflow. A pack has one square map of integer cell costs 0..99 (its size
drawn in grid_min_size..grid_max_size from the pack seed), smooth hills over a cheap background:
the sum of landscape_num_components rotated Gaussian bumps, normalized to [0, 1], squared, times
99, rounded. Cells start unknown ("?"); every cell entered reveals its Chebyshev neighbourhood
of reveal_radius, for the rest of the pack run, so later tasks see what earlier ones uncovered.

A task (from the row's seed) is a start, a goal and an exact number of rounds R (min_rounds ..
max_rounds), built by walking R random rook moves from the start. Each round the model answers
`<answer>row,col</answer>`: a different cell in the same row or column, inside the map; the move
enters every cell on the way. After R rounds the reward is 1 - (mean cost of the entered cells) / 100
when the player stands on the goal, else 0. A reply without a valid destination ends the episode
with 0 (a format error).

workflow_args (Trinity's names and defaults): grid_min_size 12, grid_max_size 16,
landscape_num_components 6, landscape_min_scale 0.10, landscape_max_scale 0.35, min_rounds 6,
max_rounds 10, reveal_radius 1. The numbers follow Trinity's generator draw for draw
(numpy default_rng), so a seed gives Trinity's map and task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task
from services.explorer.workflows.cod.episode import CodEpisodeWorkflow, answer_of

Cell = tuple[int, int]
_DESTINATION = re.compile(r"\s*(-?\d+)\s*,\s*(-?\d+)\s*")

SYSTEM_PROMPT = """You move a piece on a square grid of cells, each with a cost from 0 to 99. Costs you have
not seen show as "?". The costs stay the same from one task to the next in this environment, and
every cell you enter reveals the costs within {radius} cell(s) of it.

Each round you move like a rook: to another cell in the same row or in the same column, passing
through every cell between. You must use exactly the given number of rounds and end on the target.
Your score is 1 minus the average cost of all cells you entered divided by 100, and 0 if you miss
the target; so prefer cheap cells.

Think briefly, then end your reply with the destination as <answer>row,col</answer> (rows and
columns count from 0). An invalid answer ends the game."""


def landscape(rng: np.random.Generator, size: int, components: int, low: float, high: float) -> np.ndarray:
    """Integer costs [size, size] in 0..99 (module docstring)."""
    if components < 2 or not 0.0 < low <= high:
        raise InvalidArgument(
            "landscape_num_components must be >= 2 and 0 < landscape_min_scale <= landscape_max_scale",
            field="workflow_args.landscape_num_components",
        )
    axis = np.linspace(0.0, 1.0, size)
    rows, cols = np.meshgrid(axis, axis, indexing="ij")
    height = np.zeros((size, size))
    for _ in range(components):
        centre = rng.uniform(0.0, 1.0, size=2)
        long_scale = float(rng.uniform(low, high))
        short_scale = float(rng.uniform(low, long_scale))
        angle = float(rng.uniform(0.0, np.pi))
        amplitude = float(rng.uniform(0.8, 1.2))
        dr, dc = rows - centre[0], cols - centre[1]
        along = np.cos(angle) * dr + np.sin(angle) * dc
        across = -np.sin(angle) * dr + np.cos(angle) * dc
        height += amplitude * np.exp(-0.5 * ((along / long_scale) ** 2 + (across / short_scale) ** 2))
    span = float(height.max() - height.min())
    if span == 0.0:
        return np.zeros((size, size), dtype=np.int64)
    return np.rint(99.0 * ((height - height.min()) / span) ** 2).astype(np.int64)


@dataclass
class CostMap:
    """A pack's costs and which cells have been seen."""

    costs: np.ndarray
    seen: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.seen = np.zeros_like(self.costs, dtype=bool)

    @classmethod
    def generate(cls, seed: int, args: dict[str, Any]) -> CostMap:
        rng = np.random.default_rng(seed)
        size = int(rng.integers(int(args.get("grid_min_size", 12)), int(args.get("grid_max_size", 16)) + 1))
        return cls(
            landscape(
                rng,
                size,
                int(args.get("landscape_num_components", 6)),
                float(args.get("landscape_min_scale", 0.10)),
                float(args.get("landscape_max_scale", 0.35)),
            )
        )

    @property
    def size(self) -> int:
        return int(self.costs.shape[0])

    def reveal(self, cells: list[Cell], radius: int) -> None:
        for r, c in cells:
            self.seen[max(0, r - radius) : r + radius + 1, max(0, c - radius) : c + radius + 1] = True

    def render(self) -> str:
        lines = ["     " + "".join(f"{c:>3}" for c in range(self.size))]
        for r in range(self.size):
            cells = (str(int(self.costs[r, c])) if self.seen[r, c] else "?" for c in range(self.size))
            lines.append(f"{r:>3}  " + "".join(f"{v:>3}" for v in cells))
        return "\n".join(lines)


def generate_task(seed: int, size: int, min_rounds: int, max_rounds: int) -> tuple[Cell, Cell, int]:
    """(start, goal, rounds): a random walk of `rounds` rook moves that does not end where it began."""
    rng = np.random.default_rng(seed)
    rounds = int(rng.integers(min_rounds, max_rounds + 1))

    def other(current: int) -> int:
        value = int(rng.integers(0, size - 1))
        return value + 1 if value >= current else value

    while True:
        start = (int(rng.integers(0, size)), int(rng.integers(0, size)))
        here = start
        for _ in range(rounds):
            here = (here[0], other(here[1])) if int(rng.integers(0, 2)) == 0 else (other(here[0]), here[1])
        if here != start:
            return start, here, rounds


def path(origin: Cell, destination: Cell) -> list[Cell]:
    """Cells entered moving from origin to destination (origin excluded)."""
    (r0, c0), (r1, c1) = origin, destination
    if r0 == r1:
        step = 1 if c1 > c0 else -1
        return [(r0, c) for c in range(c0 + step, c1 + step, step)]
    step = 1 if r1 > r0 else -1
    return [(r, c0) for r in range(r0 + step, r1 + step, step)]


def move_error(origin: Cell, destination: Cell, size: int) -> str | None:
    r, c = destination
    if not (0 <= r < size and 0 <= c < size):
        return f"({r},{c}) is outside the grid."
    if destination == origin:
        return "the destination must differ from the current cell."
    if r != origin[0] and c != origin[1]:
        return "the destination must be in the same row or the same column."
    return None


def parse_destination(reply: str) -> Cell | None:
    answer = answer_of(reply)
    found = _DESTINATION.fullmatch(answer) if answer is not None else None
    return (int(found.group(1)), int(found.group(2))) if found else None


class CodGridNavigationWorkflow(CodEpisodeWorkflow):
    """See the module docstring."""

    def setup(self, task: Task) -> None:
        args, raw = task.workflow_args, task.raw_task
        self.radius = int(args.get("reveal_radius", 1))
        self.seed = int(raw.get("seed", 42))
        self.map_seed = int(raw.get("pack_seed", self.seed))
        self.rounds_range = (int(args.get("min_rounds", 6)), int(args.get("max_rounds", 10)))

    def start(self) -> None:
        key = f"grid_navigation/{self.map_seed}"
        if key not in self.pack_state:  # the pack run's first task draws the map
            self.pack_state[key] = CostMap.generate(self.map_seed, self.task.workflow_args)
        self.map: CostMap = self.pack_state[key]
        self.start_cell, self.goal, self.rounds = generate_task(self.seed, self.map.size, *self.rounds_range)
        self.here: Cell = self.start_cell
        self.entered: list[int] = []
        self.last: str | None = None

    @property
    def max_step_num(self) -> int:
        return self.rounds  # set by start(), which run_async calls first

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(radius=self.radius)

    @property
    def loss(self) -> float:
        return sum(self.entered) / (100.0 * len(self.entered)) if self.entered else 0.0

    async def step_async(self, step: int) -> tuple[bool, list[Experience]]:
        before = f"{self.last}\n\n" if self.last else ""
        exp = await self.ask(
            f"{before}Round {step + 1} of {self.rounds}. You are at ({self.here[0]},{self.here[1]}); the "
            f"target is ({self.goal[0]},{self.goal[1]}).\n\n{self.map.render()}"
        )
        destination = parse_destination(exp.response_text)
        error = (
            "expected one <answer>row,col</answer> destination."
            if destination is None
            else move_error(self.here, destination, self.map.size)
        )
        if error is not None or destination is None:
            self.format_error, self.last = True, f"Invalid action: {error} Game over."
            return False, [exp]
        cells = path(self.here, destination)
        self.entered += [int(self.map.costs[cell]) for cell in cells]
        self.map.reveal(cells, self.radius)
        self.here = destination
        self.last = (
            f"You moved to ({destination[0]},{destination[1]}) through {len(cells)} cell(s): "
            + " -> ".join(f"({r},{c})" for r, c in cells)
            + f". Mean cost so far: {self.loss:.4f} (normalized)."
        )
        exp.info["normalized_loss"] = self.loss
        done = step + 1 == self.rounds
        if done and self.here == self.goal:
            self.final_reward = 1.0 - self.loss
        return not done, [exp]

    def trajectory(self) -> str:
        return f"{super().trajectory()}\n\nFinal position {self.here}, target {self.goal}.\nCosts seen:\n{self.map.render()}"

    def feedback(self) -> str:
        if self.format_error:
            outcome = str(self.last)
        elif self.here == self.goal:
            outcome = f"Success: on the target after {self.rounds} rounds; normalized loss {self.loss:.4f}, reward {self.final_reward:.4f}."
        else:
            outcome = (
                f"Failed: after {self.rounds} rounds at {self.here}, not the target {self.goal}. Reward 0."
            )
        return f"{outcome}\n\nCosts seen:\n{self.map.render()}"
