"""cod_grid_navigation_workflow: the cost map, rook moves and their checks, an episode on scripted
replies scored by hand, and the map shared (with what was seen) by the tasks of one pack run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.common.config.cod import CodConfig
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.cod.grid_navigation import (
    CodGridNavigationWorkflow,
    CostMap,
    generate_task,
    move_error,
    parse_destination,
    path,
)
from services.explorer.workflows.cod.hints import HINT_END, HINT_START
from services.explorer.workflows.cod.pack import pack_seed, pack_tasks

ARGS = {
    "grid_min_size": 5,
    "grid_max_size": 6,
    "landscape_num_components": 3,
    "min_rounds": 2,
    "max_rounds": 2,
}


def test_the_cost_map() -> None:
    costs = CostMap.generate(3, ARGS).costs
    assert costs.shape[0] in (5, 6) and costs.shape[0] == costs.shape[1]
    assert costs.min() == 0 and costs.max() == 99  # normalized, squared, times 99
    assert np.array_equal(costs, CostMap.generate(3, ARGS).costs)  # a seed is a map
    grid = CostMap(np.arange(16).reshape(4, 4))
    grid.reveal([(0, 0)], 1)
    assert grid.seen.sum() == 4  # the corner's 2x2 neighbourhood
    assert grid.render().splitlines()[1] == "  0    0  1  ?  ?"


def test_rook_moves() -> None:
    assert path((2, 1), (2, 4)) == [(2, 2), (2, 3), (2, 4)]
    assert path((3, 0), (1, 0)) == [(2, 0), (1, 0)]
    assert move_error((0, 0), (1, 1), 5) == "the destination must be in the same row or the same column."
    assert move_error((0, 0), (0, 0), 5) is not None and move_error((0, 0), (0, 5), 5) is not None
    assert move_error((0, 0), (0, 4), 5) is None
    assert parse_destination("go <answer> 2, 3 </answer>") == (2, 3)
    assert parse_destination("<answer>2;3</answer>") is None


def test_tasks_are_walks_of_the_exact_length() -> None:
    for seed in range(20):
        start, goal, rounds = generate_task(seed, 6, 2, 4)
        assert 2 <= rounds <= 4 and start != goal
        assert generate_task(seed, 6, 2, 4) == (start, goal, rounds)


def two_moves(start: tuple[int, int], goal: tuple[int, int], size: int) -> list[tuple[int, int]]:
    if start[1] != goal[1] and start[0] != goal[0]:
        return [(start[0], goal[1]), goal]
    if start[0] == goal[0]:  # same row: a detour through another column of it
        other = next(c for c in range(size) if c not in (start[1], goal[1]))
        return [(start[0], other), goal]
    other = next(r for r in range(size) if r not in (start[0], goal[0]))
    return [(other, start[1]), goal]


def grid_task(seed: int) -> Task:
    return Task(
        workflow=CodGridNavigationWorkflow, workflow_args=dict(ARGS), raw_task={"seed": seed}, task_id="g"
    )


async def test_an_episode_reaching_the_target_scores_one_minus_the_mean_cost(make_model: Any) -> None:
    costs = CostMap.generate(7, ARGS).costs
    start, goal, rounds = generate_task(7, costs.shape[0], 2, 2)
    moves = two_moves(start, goal, costs.shape[0])
    model, _ = make_model([f"<answer>{r},{c}</answer>" for r, c in moves])
    exps = await CodGridNavigationWorkflow(task=grid_task(7), model=model).run_async()
    entered = path(start, moves[0]) + path(moves[0], goal)
    expected = 1 - np.mean([costs[cell] for cell in entered]) / 100
    assert len(exps) == rounds == 2 and [e.reward for e in exps] == pytest.approx([expected] * 2)
    assert exps[-1].info["feedback"].startswith("Success")
    assert f"target is ({goal[0]},{goal[1]})" in exps[0].info["user_prompt"]


async def test_an_illegal_move_ends_the_episode_with_zero(make_model: Any) -> None:
    start, _, _ = generate_task(7, CostMap.generate(7, ARGS).size, 2, 2)
    model, _ = make_model([f"<answer>{start[0] + 1},{start[1] + 1}</answer>"])  # diagonal
    exps = await CodGridNavigationWorkflow(task=grid_task(7), model=model).run_async()
    assert len(exps) == 1 and exps[0].reward == 0.0 and exps[0].metrics["format_error_termination"] == 1.0


async def test_a_pack_run_shares_the_map_and_what_was_seen(make_model: Any) -> None:
    tasks = [
        Task(
            workflow=WORKFLOWS.get("cod_grid_navigation_workflow"),
            workflow_args=dict(ARGS),
            raw_task={"seed": seed},
            task_id=str(seed),
            index=seed,
            taskset="grid",
        )
        for seed in (7, 8)
    ]
    (pack,) = pack_tasks(tasks, CodConfig(task_pack_size=2, cod_workflow_args={"inject_pack_seed": True}))
    size = CostMap.generate(pack_seed(pack, tasks, stable=False), ARGS).size
    start, _, _ = generate_task(7, size, 2, 2)
    across = (start[0], (start[1] + 1) % size)  # one legal move of task 0, then no answer
    replies = [
        f"<answer>{across[0]},{across[1]}</answer>",
        "no answer",
        f"{HINT_START}\n- valleys\n{HINT_END}",
    ]
    model, engine = make_model([*replies, "no answer"])
    exps = await pack.workflow(task=pack, model=model).run_async()
    assert [e.info["exp_type"] for e in exps] == ["solve_task", "solve_task", "gen_hint", "solve_task"]

    def unknown(prompt: str) -> int:
        return sum(line.count("?") for line in prompt.splitlines()[-size:])

    # task 0 starts blind; task 1 starts with what task 0's move revealed (radius 1 around one cell)
    assert unknown(exps[0].info["user_prompt"]) == size * size
    assert unknown(exps[3].info["user_prompt"]) == unknown(exps[1].info["user_prompt"]) < size * size
