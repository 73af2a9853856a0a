"""sudoku_workflow: rules on a hand-worked board, move parsing, Trinity's prompt, step rewards.

The workflow also runs once end to end on the builtin `tiny-30m` model (~600 characters per
step do not fit the 256 positions of `tiny-arith`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from services.common.experience import Experience
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.base import RolloutArgs
from services.explorer.workflows.sudoku import (
    SudokuWorkflow,
    apply_moves,
    build_prompt,
    generate,
    is_valid,
    parse_board,
    parse_moves,
)

# --- sudoku ------------------------------------------------------------------------------------------

# a valid full board: row r is 1..9 shifted by 3r + r//3
SOLUTION = [[(3 * r + r // 3 + c) % 9 + 1 for c in range(9)] for r in range(9)]
HOLES = [(0, 0), (0, 1), (4, 4)]


def puzzle() -> list[list[int]]:
    board = [row[:] for row in SOLUTION]
    for r, c in HOLES:
        board[r][c] = 0
    return board


def _with(board: list[list[int]], *moves: tuple[int, int, int]) -> list[list[int]]:
    for r, c, v in moves:
        board[r][c] = v
    return board


def test_row_column_and_block_repeats_are_invalid() -> None:
    assert SOLUTION[0] == [1, 2, 3, 4, 5, 6, 7, 8, 9] and SOLUTION[4][4] == 9
    assert [SOLUTION[r][0] for r in range(9)] == [1, 4, 7, 2, 5, 8, 3, 6, 9]
    assert is_valid(SOLUTION) and is_valid(puzzle())
    assert not is_valid(_with(puzzle(), (0, 0, 3)))  # row 0 already holds 3 at (0, 2)
    assert not is_valid(_with(puzzle(), (0, 0, 2)))  # row 0 lacks 2 but column 0 holds it at (3, 0)
    # 4x4: each row and column has one 1, but the top-left 2x2 block has two
    assert not is_valid([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert is_valid([[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]])


def test_valid_move_invalid_move_and_filled_cell() -> None:
    board = puzzle()
    assert apply_moves(board, [(0, 0, 1)]) and board[0][0] == 1  # the solution's value: valid
    board = puzzle()
    assert not apply_moves(board, [(0, 0, 3)])  # 3 is at (0, 2): repeated in row 0
    board = puzzle()
    assert not apply_moves(board, [(0, 2, 3)])  # (0, 2) is a given cell
    assert not apply_moves(puzzle(), None) and not apply_moves(puzzle(), [])


def test_parse_moves_rules() -> None:
    assert parse_moves("0 0 1\n\n  4 4 9 \n", max_moves=5) == [(0, 0, 1), (4, 4, 9)]
    assert parse_moves("Move: 0 0 1", max_moves=5) is None  # a line that is not three numbers
    assert parse_moves("0 0 1\nthat's it", max_moves=5) is None
    assert parse_moves("9 0 1", max_moves=5) is None and parse_moves("0 0 0", max_moves=5) is None
    assert parse_moves("\n".join(["0 0 1"] * 6), max_moves=5) is None  # more than max_moves
    assert parse_moves("   ", max_moves=5) is None
    assert parse_moves("3 3 4", max_moves=1, size=4) == [(3, 3, 4)]
    assert parse_moves("3 3 5", max_moves=1, size=4) is None


def test_prompt_is_trinitys_text() -> None:
    board = parse_board("1.3.\n..4.\n2...\n...1", "puzzle")
    assert board == [[1, 0, 3, 0], [0, 0, 4, 0], [2, 0, 0, 0], [0, 0, 0, 1]]
    expected = (
        "You are playing a Sudoku game.\n\n"
        "Rules:\n- The board is 4x4.\n- 0 means empty.\n"
        "- Numbers 1–4 must appear exactly once in every row, column, and 2x2 block.\n"
        "- You may only fill empty cells.\n\n"
        "Task:\n- In each step, output ONE OR MORE valid moves.\n- You may output up to 5 moves per step.\n\n"
        "Output format (STRICT):\nrow col value\nrow col value\n\n"
        "Example:\n0 2 4\n1 3 5\n\n"
        "Current step: 2\nRemaining steps: 18\n\n"
        "Current board:\n1 0 3 0\n0 0 4 0\n2 0 0 0\n0 0 0 1\n"
    )
    assert build_prompt(board, 2, 20, 5, unchanged=False) == expected
    assert build_prompt(board, 2, 20, 5, unchanged=True) == expected + (
        "\nYour previous response was invalid or had no effect. Please follow the rules and output format strictly."
    )
    nine = build_prompt(SOLUTION, 0, 20, 5, unchanged=False)
    assert "- The board is 9x9.\n" in nine and "and 3x3 block.\n" in nine and "1–9" in nine


def test_generated_puzzles_are_seeded_and_sized_by_difficulty() -> None:
    puzzle_a, solution_a = generate(difficulty="hard", seed=5)
    assert (puzzle_a, solution_a) == generate(difficulty="hard", seed=5)
    assert is_valid(solution_a) and all(v for row in solution_a for v in row)
    assert sum(v == 0 for row in puzzle_a for v in row) == 54  # two thirds of 81
    assert all(
        p in (0, s) for pr, sr in zip(puzzle_a, solution_a, strict=True) for p, s in zip(pr, sr, strict=True)
    )
    assert sum(v == 0 for row in generate(difficulty="easy", seed=1)[0] for v in row) == 27


class CannedChatModel:
    """chat() answers with the next scripted reply; records the prompts."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.prompts: list[str] = []
        self.kwargs: list[dict[str, Any]] = []

    def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> list[Experience]:
        (message,) = messages
        self.prompts.append(message["content"])
        self.kwargs.append(kwargs)
        reply = self.replies.pop(0)
        return [
            Experience(
                tokens=np.arange(4 + len(reply)), prompt_length=4, model_version=0, response_text=reply
            )
        ]


def sudoku_task(**workflow_args: Any) -> Task:
    return Task(
        workflow=WORKFLOWS.get("sudoku_workflow"),
        raw_task={"puzzle": puzzle(), "solution": SOLUTION},
        workflow_args=workflow_args,
        rollout_args=RolloutArgs(n=4, temperature=0.5),
    )


def test_sudoku_solved_in_two_steps_rewards_zero_then_one() -> None:
    model = CannedChatModel(["0 0 1\n0 1 2", "4 4 9"])
    exps = sudoku_task().to_workflow(model).run()
    assert [e.reward for e in exps] == [0.0, 1.0]
    assert all(e.metrics == {"accuracy": 1.0, "steps": 2.0} for e in exps)
    assert exps[0].info["moves"] == [[0, 0, 1], [0, 1, 2]]
    assert "Current step: 1\nRemaining steps: 19\n" in model.prompts[1]
    assert "Current board:\n1 2 3 4 5 6 7 8 9\n" in model.prompts[1]  # the first step's moves are in
    assert model.kwargs[0] == {"n": 1, "temperature": 0.5}


def test_sudoku_invalid_step_scores_minus_one_and_stops() -> None:
    model = CannedChatModel(["0 0 1", "0 1 3", "4 4 9"])  # 3 repeats row 0
    exps = sudoku_task().to_workflow(model).run()
    assert [e.reward for e in exps] == [0.0, -1.0] and len(model.replies) == 1
    assert exps[-1].metrics == {"accuracy": 0.0, "steps": 2.0}
    model = CannedChatModel(["I would put 1 in the corner"])
    assert [e.reward for e in sudoku_task().to_workflow(model).run()] == [-1.0]


def test_sudoku_max_steps_and_reset() -> None:
    model = CannedChatModel(["0 0 1", "0 1 2"])
    workflow = sudoku_task(max_steps=2).to_workflow(model)
    assert isinstance(workflow, SudokuWorkflow)
    assert [e.reward for e in workflow.run()] == [0.0, 0.0]  # out of steps before the last cell
    workflow.reset(sudoku_task(max_moves_per_step=1))
    assert workflow.max_steps == 20 and workflow.max_moves_per_step == 1
    model.replies = ["0 0 1\n0 1 2"]
    assert [e.reward for e in workflow.run()] == [-1.0]  # two moves where one is allowed
    generated = Task(workflow=SudokuWorkflow, raw_task={"seed": 3}).to_workflow(model)
    assert isinstance(generated, SudokuWorkflow) and is_valid(generated.solution)


# --- end to end on a real model -----------------------------------------------------------------


async def test_sudoku_on_tiny_model(tiny_30m: Any) -> None:
    from services.explorer.model_wrapper import ModelWrapper
    from services.explorer.runner import VersionRef, WorkflowRunner

    engine, tok = tiny_30m
    runner = WorkflowRunner(
        lambda i: ModelWrapper(engine, tok, max_prompt_tokens=1000, max_response_tokens=8),
        slots=1,
        max_timeout=120,
        max_retry_times=0,
        version_fn=VersionRef(1),
    )
    task = sudoku_task(max_steps=3)
    task.task_id, task.repeat_times = "sudoku", 2
    results = await runner.run_tasks([task])
    for result in results:
        exps = result.experiences
        assert not result.skipped and 1 <= len(exps) <= 3
        rewards = [e.reward for e in exps]
        assert all(r == 0.0 for r in rewards[:-1]) and rewards[-1] in (-1.0, 0.0, 1.0)
        assert [e.step for e in exps] == list(range(len(exps)))
        # the builtin chat template is the message itself ("–" is outside the tokenizer: <unk>)
        expected = ModelWrapper(engine, tok).tokenize(build_prompt(puzzle(), 0, 3, 5, unchanged=False))
        assert exps[0].tokens[: exps[0].prompt_length].tolist() == expected
        for exp in exps:
            assert exp.action_mask.all() and len(exp.logprobs) == exp.response_length <= 8
