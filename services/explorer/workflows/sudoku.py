"""`sudoku_workflow`: Trinity-RFT's SudokuWorkflow, a step-wise multi-turn game.

Each step shows the model the rules and the current board in one fresh user message and asks for
up to `max_moves_per_step` moves, one `row col value` line each (0-based row and column). Each step
is one experience (the model's reply to that message, all of it action tokens) with its own reward,
Trinity's rule:
- -1 and the episode ends: a reply that is not only move lines, has no move or too many, names a
  cell or value out of range, writes on a filled cell, or leaves a row, column or block with a
  repeated number;
- +1 and the episode ends: the board now equals the solution;
- 0 otherwise, and the next step sees the new board (at most `max_steps` steps).
The task row holds `puzzle` and `solution` (9x9 lists of ints, 0 for empty; an 81-character
string of digits, `.` for empty, also works); without them a puzzle is generated from `seed`.
`workflow_args`: `max_steps` (20) and `max_moves_per_step` (5), Trinity's fixed values, and
`difficulty` (easy / medium / hard: a third, half or two thirds of the cells emptied) for
generated puzzles. Every experience of a run carries metric `accuracy` (1.0 when solved) and
`steps` (steps played).
"""

from __future__ import annotations

import math
import random
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import ResettableWorkflow, Task

Board = list[list[int]]
Move = tuple[int, int, int]
HOLES = {"easy": 1 / 3, "medium": 1 / 2, "hard": 2 / 3}


def parse_board(value: Any, field: str) -> Board:
    """A square board from a list of rows (ints or digit strings) or one string of n*n characters."""
    if isinstance(value, str):
        cells = [0 if ch in ".0" else int(ch) for ch in value if ch in ".0123456789"]
        side = math.isqrt(len(cells))
        rows = [cells[r * side : (r + 1) * side] for r in range(side)]
    else:
        rows = [[int(v) for v in row] for row in value]
    side = len(rows)
    block = math.isqrt(side)
    if side == 0 or block * block != side or any(len(row) != side for row in rows):
        raise InvalidArgument(
            f"a sudoku board is n x n with n a square (4, 9, ...), got {len(rows)} rows", field=field
        )
    if any(not 0 <= v <= side for row in rows for v in row):
        raise InvalidArgument(f"board values must be 0 (empty) .. {side}", field=field)
    return rows


def _groups(board: Board) -> list[list[int]]:
    """Every row, column and block of the board."""
    side = len(board)
    block = math.isqrt(side)
    columns = [[board[r][c] for r in range(side)] for c in range(side)]
    blocks = [
        [board[r][c] for r in range(br, br + block) for c in range(bc, bc + block)]
        for br in range(0, side, block)
        for bc in range(0, side, block)
    ]
    return [*board, *columns, *blocks]


def is_valid(board: Board) -> bool:
    """No number repeats in a row, column or block (empty cells, 0, are ignored)."""
    for group in _groups(board):
        filled = [v for v in group if v]
        if len(filled) != len(set(filled)):
            return False
    return True


def generate(size: int = 9, difficulty: str = "medium", seed: int | None = None) -> tuple[Board, Board]:
    """(puzzle, solution): a random full board by backtracking, then a share of cells emptied."""
    rng = random.Random(seed)
    board = [[0] * size for _ in range(size)]
    block = math.isqrt(size)

    def fits(r: int, c: int, v: int) -> bool:
        br, bc = r - r % block, c - c % block
        return (
            v not in board[r]
            and all(board[i][c] != v for i in range(size))
            and all(board[i][j] != v for i in range(br, br + block) for j in range(bc, bc + block))
        )

    def fill(cell: int) -> bool:
        if cell == size * size:
            return True
        r, c = divmod(cell, size)
        values = list(range(1, size + 1))
        rng.shuffle(values)
        for v in values:
            if fits(r, c, v):
                board[r][c] = v
                if fill(cell + 1):
                    return True
                board[r][c] = 0
        return False

    fill(0)
    solution = [row[:] for row in board]
    cells = [(r, c) for r in range(size) for c in range(size)]
    rng.shuffle(cells)
    for r, c in cells[: int(size * size * HOLES.get(difficulty, HOLES["medium"]))]:
        board[r][c] = 0
    return board, solution


def render_board(board: Board) -> str:
    return "\n".join(" ".join(str(v) for v in row) for row in board)


def parse_moves(text: str, max_moves: int, size: int = 9) -> list[Move] | None:
    """The reply's `row col value` lines, or None when any non-blank line is not one or the count is off."""
    moves = []
    for line in text.strip().splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 3:
            return None
        try:
            r, c, v = (int(p) for p in parts)
        except ValueError:
            return None
        if not (0 <= r < size and 0 <= c < size and 1 <= v <= size):
            return None
        moves.append((r, c, v))
    return moves if 0 < len(moves) <= max_moves else None


def build_prompt(board: Board, step: int, max_steps: int, max_moves: int, unchanged: bool) -> str:
    """Trinity's step prompt (its text for 9x9, the sizes filled in for other boards)."""
    side, block = len(board), math.isqrt(len(board))
    prompt = (
        "You are playing a Sudoku game.\n\n"
        "Rules:\n"
        f"- The board is {side}x{side}.\n"
        "- 0 means empty.\n"
        f"- Numbers 1–{side} must appear exactly once in every row, column, and {block}x{block} block.\n"
        "- You may only fill empty cells.\n\n"
        "Task:\n"
        "- In each step, output ONE OR MORE valid moves.\n"
        f"- You may output up to {max_moves} moves per step.\n\n"
        "Output format (STRICT):\n"
        "row col value\n"
        "row col value\n\n"
        "Example:\n"
        "0 2 4\n"
        "1 3 5\n\n"
        f"Current step: {step}\n"
        f"Remaining steps: {max_steps - step}\n\n"
        f"Current board:\n{render_board(board)}\n"
    )
    if unchanged:
        prompt += (
            "\nYour previous response was invalid or had no effect. "
            "Please follow the rules and output format strictly."
        )
    return prompt


def apply_moves(board: Board, moves: list[Move] | None) -> bool:
    """Fill the cells in order; False (board partly written) when a move hits a filled cell or breaks a rule."""
    if not moves:
        return False
    for r, c, v in moves:
        if board[r][c] != 0:
            return False
        board[r][c] = v
    return is_valid(board)


class SudokuWorkflow(ResettableWorkflow):
    """See the module docstring. One episode per run, one experience per step."""

    def reset(self, task: Task) -> None:
        self.task = task
        raw, args = task.raw_task, task.workflow_args
        if raw.get("puzzle") is not None and raw.get("solution") is not None:
            self.puzzle = parse_board(raw["puzzle"], "raw_task.puzzle")
            self.solution = parse_board(raw["solution"], "raw_task.solution")
            if len(self.puzzle) != len(self.solution):
                raise InvalidArgument("puzzle and solution differ in size", field="raw_task.solution")
        else:
            seed = raw.get("seed")
            self.puzzle, self.solution = generate(
                difficulty=str(args.get("difficulty", "medium")), seed=None if seed is None else int(seed)
            )
        self.max_steps = int(args.get("max_steps", 20))
        self.max_moves_per_step = int(args.get("max_moves_per_step", 5))
        self.sampling = {**task.rollout_args.sampling(), "n": 1}

    def run(self) -> list[Experience]:
        board = [row[:] for row in self.puzzle]
        previous: Board | None = None
        experiences: list[Experience] = []
        for step in range(self.max_steps):
            prompt = build_prompt(board, step, self.max_steps, self.max_moves_per_step, board == previous)
            exp = self.model.chat([{"role": "user", "content": prompt}], **self.sampling)[0]
            previous = [row[:] for row in board]
            moves = parse_moves(exp.response_text, self.max_moves_per_step, len(board))
            if not apply_moves(board, moves):
                exp.reward = -1.0
            elif board == self.solution:
                exp.reward = 1.0
            else:
                exp.reward = 0.0
            exp.info["moves"] = [list(m) for m in moves or []]
            experiences.append(exp)
            if exp.reward != 0.0:
                break
        solved = float(board == self.solution)
        for exp in experiences:
            exp.metrics.update({"accuracy": solved, "steps": float(len(experiences))})
        return experiences
