"""FrozenLake in pure Python, matching the gymnasium environment Trinity-RFT's frozen_lake_workflow drives.

The board is a list of row strings over `S` (start), `F` (frozen), `H` (hole) and `G` (goal). The
random number stream is numpy's PCG64 seeded exactly as `gymnasium.utils.seeding.np_random(seed)`
seeds it, and every draw happens where gymnasium draws, so for the same seed this module generates
the same map as Trinity's `generate_random_map` and, on a slippery lake, slides the same way as
gymnasium's `FrozenLakeEnv` after `reset(seed=seed)`: one draw at reset (the start-state sample)
and one per move, even on a non-slippery lake.

Actions are Trinity's numbering, not gymnasium's: 1 Left, 2 Down, 3 Right, 4 Up; 0 (or anything
else) is the invalid action, which leaves the player where it was and draws nothing. Reaching `G`
pays 1.0 and ends the episode; falling into `H` ends it with 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument

INVALID_ACTION = 0
ACTION_NAMES = {1: "Left", 2: "Down", 3: "Right", 4: "Up"}
_DIRECTIONS = {name.lower(): action for action, name in ACTION_NAMES.items()}
# (row, col) change of each action
_MOVES = {1: (0, -1), 2: (1, 0), 3: (0, 1), 4: (-1, 0)}
# gymnasium's slip: the intended direction or one of its two perpendiculars, 1/3 each, in the
# order (action - 1, action, action + 1) of gymnasium's 0-based numbering (Left, Down, Right, Up)
_SLIPS = {1: (4, 1, 2), 2: (1, 2, 3), 3: (2, 3, 4), 4: (3, 4, 1)}
_ACTION_BLOCK = re.compile(r"```(.*?)```", re.DOTALL)

# one cell of the text observation (Trinity's GRID_LOOKUP): symbol between spaces, then a tab
_CELL_TEXT = {"S": " _ \t", "F": " _ \t", "H": " O \t", "G": " G \t"}
_PLAYER_TEXT = {"H": " X \t", "G": " √ \t"}  # player in a hole / on the goal
_PLAYER = " P \t"


def _rng(seed: int) -> np.random.Generator:
    """The generator gymnasium.utils.seeding.np_random(seed) returns."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed))))


def reaches_goal(board: list[list[str]], max_steps: int) -> bool:
    """Trinity's path check: a depth-first search from `S` that gives up on cells reached after max_steps.

    Like Trinity's `is_valid` it marks a cell visited the first time it is popped, whatever the
    number of steps that got there, so it can miss a short path that a long one visited first;
    kept as is because it decides which seeds Trinity re-draws, and so which map a seed gives.
    """
    size = len(board)
    start = next((r, c) for r in range(size) for c in range(size) if board[r][c] == "S")
    stack, visited = [(start[0], start[1], 0)], set()
    while stack:
        r, c, steps = stack.pop()
        if steps > max_steps or (r, c) in visited:
            continue
        visited.add((r, c))
        for dr, dc in ((1, 0), (0, 1), (-1, 0), (0, -1)):
            nr, nc = r + dr, c + dc
            if not (0 <= nr < size and 0 <= nc < size):
                continue
            if board[nr][nc] == "G":
                return True
            if board[nr][nc] != "H":
                stack.append((nr, nc, steps + 1))
    return False


def generate_random_map(
    size: int = 8, p: float = 0.8, seed: int = 0, max_steps: int = 5
) -> tuple[list[str], tuple[int, int]]:
    """A size x size map whose goal `reaches_goal` within max_steps, and the goal's (row, col).

    Each tile is frozen with probability p (else a hole); start and goal are drawn uniformly until
    they differ; the whole draw repeats until the check passes (Trinity's rules and draw order).
    """
    if int(size) < 2:
        raise InvalidArgument(
            f"a frozen lake needs size >= 2 (start and goal on different tiles), got {size}",
            field="raw_task.size",
        )
    size, p = int(size), min(1.0, float(p))
    rng = _rng(seed)
    while True:
        board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p]).tolist()
        while True:
            start = (int(rng.integers(0, size)), int(rng.integers(0, size)))
            goal = (int(rng.integers(0, size)), int(rng.integers(0, size)))
            if start != goal:
                break
        board[start[0]][start[1]] = "S"
        board[goal[0]][goal[1]] = "G"
        if reaches_goal(board, max_steps):
            return ["".join(row) for row in board], goal


def parse_action(response: str) -> int:
    """The action in the reply's last ``` ``` block: a direction name (any case) or its number 1-4; else 0."""
    blocks = _ACTION_BLOCK.findall(response)
    if not blocks:
        return INVALID_ACTION
    text = blocks[-1].strip().lower()
    if text in _DIRECTIONS:
        return _DIRECTIONS[text]
    if text.isdigit() and int(text) in ACTION_NAMES:
        return int(text)
    return INVALID_ACTION


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    moved: bool  # the player changed tiles (Trinity's info["action_is_effective"])


@dataclass
class FrozenLake:
    """One lake: `reset(seed)` puts the player on `S`; `step(action)` moves it (see the module docstring)."""

    desc: list[str]
    is_slippery: bool = False
    position: tuple[int, int] = field(init=False, default=(0, 0))
    _rng: np.random.Generator = field(init=False, repr=False, default_factory=lambda: _rng(0))

    def __post_init__(self) -> None:
        self.desc = [str(row) for row in self.desc]
        width = {len(row) for row in self.desc}
        if not self.desc or len(width) != 1:
            raise InvalidArgument("the map rows must all have the same length", field="workflow_args.desc")
        cells = "".join(self.desc)
        if set(cells) - set("SFHG") or cells.count("S") != 1:
            raise InvalidArgument(
                f"a map is rows of S, F, H, G with exactly one S, got {self.desc}", field="workflow_args.desc"
            )
        self.position = self._find("S")

    @property
    def goal_position(self) -> tuple[int, int] | None:
        return self._find("G") if "G" in "".join(self.desc) else None

    def _find(self, tile: str) -> tuple[int, int]:
        return next((r, row.index(tile)) for r, row in enumerate(self.desc) if tile in row)

    def tile(self) -> str:
        return self.desc[self.position[0]][self.position[1]]

    def reset(self, seed: int) -> str:
        self._rng = _rng(seed)
        self._rng.random()  # gymnasium samples the start state (there is one S)
        self.position = self._find("S")
        return self.render()

    def step(self, action: int) -> StepResult:
        """Trinity's env_step: on the goal already -> reward 1, done; an invalid action -> no move."""
        if self.tile() == "G":
            return StepResult(self.render(), 1.0, True, False)
        if action not in ACTION_NAMES:
            return StepResult(self.render(), 0.0, False, False)
        before = self.position
        draw = self._rng.random()
        if self.tile() == "H":  # gymnasium: a terminal tile absorbs every action
            return StepResult(self.render(), 0.0, True, False)
        if self.is_slippery:
            # gymnasium's categorical sample over three 1/3 outcomes
            direction = _SLIPS[action][int(np.argmax(np.cumsum([1 / 3] * 3) > draw))]
        else:
            direction = action
        dr, dc = _MOVES[direction]
        rows, cols = len(self.desc), len(self.desc[0])
        self.position = (min(max(before[0] + dr, 0), rows - 1), min(max(before[1] + dc, 0), cols - 1))
        tile = self.tile()
        return StepResult(self.render(), float(tile == "G"), tile in "GH", self.position != before)

    def render(self) -> str:
        """Trinity's text observation: one line per row, each tile as " x \\t" (P player, _ frozen, O hole, G goal)."""
        lines = []
        for r, row in enumerate(self.desc):
            cells = []
            for c, tile in enumerate(row):
                if (r, c) == self.position:
                    cells.append(_PLAYER_TEXT.get(tile, _PLAYER))
                else:
                    cells.append(_CELL_TEXT[tile])
            lines.append("".join(cells))
        return "\n".join(lines)


def lake_of_task(args: dict[str, Any], raw: dict[str, Any], max_steps: int) -> tuple[FrozenLake, int]:
    """A task's lake and seed: workflow_args `desc` (rows of S/F/H/G) or a random map of the task's
    `size` (Trinity defaults it to 1, which no map satisfies; 4 is gymnasium's classic lake) and
    `p`, from its `seed` (42), reachable within `max_steps`; `is_slippery` from workflow_args."""
    seed = int(raw.get("seed", 42))
    desc = args.get("desc")
    if desc is None:
        desc, _ = generate_random_map(
            size=int(raw.get("size", 4)), p=float(raw.get("p", 0.8)), seed=seed, max_steps=max_steps
        )
    return FrozenLake(list(desc), is_slippery=bool(args.get("is_slippery", False))), seed
