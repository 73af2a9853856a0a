"""cod_frozenlake_obscure_workflow: the hidden code mapping, the answer parser, and episodes played by
the real ModelWrapper over scripted replies (and once by the real tiny model)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.common.errors import InvalidArgument
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.cod.frozen_lake_obscure import (
    CodFrozenLakeObscureWorkflow,
    action_mapping,
    mapping_by_index,
    mapping_by_seed,
    parse_code,
)

# S F      start top left, goal bottom right; the hole at (1, 0)
# H G
LAKE = ["SF", "HG"]
GLOBAL = {"mapping_mode": "global", "global_mapping": {1: "Up", 2: "Left", 3: "Down", 4: "Right"}}


def task(**workflow_args: Any) -> Task:
    return Task(
        workflow=CodFrozenLakeObscureWorkflow,
        workflow_args={"desc": LAKE, "agent_max_steps": 3, **workflow_args},
        raw_task={"seed": 7},
        task_id="t",
    )


def test_mappings_by_mode() -> None:
    # itertools order of (Down, Right, Up, Left): index 0 is the identity order, 1 swaps the last two
    assert mapping_by_index(0) == {1: "Down", 2: "Right", 3: "Up", 4: "Left"}
    assert mapping_by_index(1) == {1: "Down", 2: "Right", 3: "Left", 4: "Up"}
    assert mapping_by_index(24) == mapping_by_index(0)
    shuffled = ["Down", "Right", "Up", "Left"]
    random.Random(5).shuffle(shuffled)
    assert mapping_by_seed(5) == dict(enumerate(shuffled, start=1))
    assert action_mapping({}, {}) == {1: "Down", 2: "Right", 3: "Up", 4: "Left"}
    assert action_mapping({"mapping_index": 1}, {}) == mapping_by_index(1)
    # per pack: the pack's seed, whatever the row's seed; outside a pack the row's seed
    assert action_mapping({"mapping_mode": "per_pack"}, {"seed": 1, "pack_seed": 9}) == mapping_by_seed(9)
    assert action_mapping({"mapping_mode": "per_pack"}, {"seed": 1}) == mapping_by_seed(1)
    assert action_mapping({"mapping_mode": "per_task"}, {"mapping_index": 2}) == mapping_by_index(2)
    assert action_mapping({"mapping_mode": "per_task"}, {"action_mapping": {"1": "Up"}}) == {1: "Up"}
    with pytest.raises(InvalidArgument, match="mapping_mode"):
        action_mapping({"mapping_mode": "per_step"}, {})


def test_parse_code() -> None:
    assert parse_code("go right <answer>Direction 4</answer>") == 4
    assert parse_code("<answer>direction 2 </answer>") == 2
    assert parse_code("<answer>Right</answer>") is None
    assert parse_code("Direction 1") is None
    assert parse_code("<answer>Direction 1</answer><answer>Direction 2</answer>") is None  # two answers


async def test_a_winning_episode_one_row_per_move(make_model: Any) -> None:
    # codes: 4 is Right, 3 is Down: (0,0) -> (0,1) -> (1,1) = G
    model, engine = make_model(["<answer>Direction 4</answer>", "<answer>Direction 3</answer>"])
    workflow = WORKFLOWS.get("cod_frozenlake_obscure_workflow")(task=task(**GLOBAL), model=model)
    workflow.set_hint("Hints: 4 moves right")
    exps = await workflow.run_async()
    assert [e.step for e in exps] == [0, 1] and [e.reward for e in exps] == [1.0, 1.0]
    assert exps[-1].info["feedback"].startswith("Success")
    assert exps[-1].metrics["actual_env_steps"] == 2 and exps[-1].metrics["format_error_termination"] == 0
    assert "moved you from row 0, column 0 to row 0, column 1" in exps[1].info["user_prompt"]
    # the hint reaches the system prompt; the trajectory keeps the rules without it
    assert "Hints: 4 moves right" in exps[0].messages[0].content
    trajectory = exps[-1].info["trajectory"]
    assert "4 moves right" not in trajectory and trajectory.count("Step ") == 2
    assert "Action: <answer>Direction 3</answer>" in trajectory


async def test_a_hole_and_a_bad_answer_score_zero(make_model: Any) -> None:
    model, _ = make_model(["<answer>Direction 3</answer>"])  # Down: into the hole
    exps = await CodFrozenLakeObscureWorkflow(task=task(**GLOBAL), model=model).run_async()
    assert len(exps) == 1 and exps[0].reward == 0.0 and "hole" in exps[0].info["feedback"]
    model, _ = make_model(["I move right"])  # no answer block: game over, a format error
    exps = await CodFrozenLakeObscureWorkflow(task=task(**GLOBAL), model=model).run_async()
    assert len(exps) == 1 and exps[0].reward == 0.0
    assert exps[0].metrics["format_error_termination"] == 1.0 and "Invalid answer" in exps[0].info["feedback"]


async def test_the_length_penalty_of_a_solved_episode(make_model: Any) -> None:
    # replies of 29 tokens (28 characters + <eos>); ramp (29 - 10) / (48 - 10) = 0.5; 2 of 3 steps
    # reward 1 - 0.3 * (0.5 + 2/3) = 0.65
    model, _ = make_model(["<answer>Direction 4</answer>", "<answer>Direction 3</answer>"])
    args = {**GLOBAL, "length_penalty_coef": 0.3, "len_zero_penalty": 10, "len_full_penalty": 48}
    exps = await CodFrozenLakeObscureWorkflow(task=task(**args), model=model).run_async()
    assert exps[0].response_length == 29
    assert exps[0].reward == pytest.approx(1 - 0.3 * (0.5 + 2 / 3))


async def test_the_tiny_model_plays_an_episode(tiny_30m: tuple[Any, Any]) -> None:
    from services.explorer.model_wrapper import ModelWrapper

    model = ModelWrapper(tiny_30m[0], tiny_30m[1], max_response_tokens=8)
    exps = await CodFrozenLakeObscureWorkflow(task=task(mapping_mode="per_pack"), model=model).run_async()
    assert 1 <= len(exps) <= 3 and all(e.response_length >= 1 for e in exps)
    assert exps[-1].info["trajectory"].startswith("System:\nYou are playing FrozenLake")
    assert {e.reward for e in exps} <= {0.0, 1.0}
