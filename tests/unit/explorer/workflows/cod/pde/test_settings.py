"""The environment's workflow_args (Trinity's names and defaults, refused by name when wrong) and the
pack a task opens or continues."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.errors import InvalidArgument
from services.explorer.workflows.cod.pde.settings import PACK_KEY, PdeSettings, open_pack
from services.explorer.workflows.cod.pde.terms import LIBRARY

ARGS = {"pde_state_abs_limit": 3.0, "initial_condition_shape": {"mode_count_range": [1, 2]}}
SMALL = {**ARGS, "ground_truth_family": "small_demo", "pde_grid_size": 17, "pde_time_steps": 51}


def test_defaults_are_trinitys() -> None:
    s = PdeSettings.from_args(ARGS)
    assert s.dictionary == list(LIBRARY) and (s.min_terms, s.max_terms) == (1, 2)
    assert (s.max_steps, s.point_budget, s.noise, s.kappa_threshold, s.blind_penalty) == (
        10,
        15,
        0.002,
        100.0,
        100.0,
    )
    assert (s.grid_size, s.time_steps, s.family, s.dump) == (257, 2001, "physical_general.json", True)
    assert s.support_size_text() == "1 to 2"
    assert PdeSettings.from_args({**ARGS, "pde_grid_size": 64}).grid_size == 65  # odd: x = 0.5 is a node
    narrow = PdeSettings.from_args(
        {**ARGS, "dictionary_terms": ["u"], "min_reaction_terms": 1, "max_reaction_terms": 3}
    )
    assert narrow.term_range() == (1, 1) and narrow.support_size_text() == "exactly 1"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"pde_state_abs_limit": None}, "workflow_args.pde_state_abs_limit"),
        ({"pde_state_abs_limit": 0}, "workflow_args.pde_state_abs_limit"),
        ({"initial_condition_shape": None}, "workflow_args.initial_condition_shape"),
        ({"dictionary_terms": ["u", "cos(u)"]}, "workflow_args.dictionary_terms"),
        ({"dictionary_terms": []}, "workflow_args.dictionary_terms"),
        ({"min_reaction_terms": 2, "max_reaction_terms": 1}, "workflow_args.max_reaction_terms"),
        ({"noise_level": -0.1}, "workflow_args.noise_level"),
        ({"kappa_threshold": float("inf")}, "workflow_args.kappa_threshold"),
        ({"max_steps": 2.5}, "workflow_args.max_steps"),
        ({"pde_time_steps": 20}, "workflow_args.pde_time_steps"),
    ],
)
def test_bad_arguments_are_refused_by_name(change: dict[str, Any], field: str) -> None:
    args = {**ARGS, **change}
    args = {k: v for k, v in args.items() if v is not None}
    with pytest.raises(InvalidArgument) as info:
        PdeSettings.from_args(args)
    assert info.value.field == field


def test_a_pack_is_opened_at_position_1_and_continued_in_order() -> None:
    s = PdeSettings.from_args(SMALL)
    shared: dict[str, Any] = {}
    row = {"seed": 1, "pack_seed": 99, "pack_size": 3}
    pack, position = open_pack(s, {**row, "task_idx": 0}, shared)
    assert position == 1 and shared[PACK_KEY] is pack and pack.trajectories == 3
    assert pack.environment_seed == 99 and 1 <= len(pack.equation) <= 2
    again, position = open_pack(s, {**row, "seed": 2, "task_idx": 1}, shared)
    assert again is pack and position == 2
    with pytest.raises(
        InvalidArgument, match="from task_idx 0: this one is at 3, the pack expects 2"
    ) as info:
        open_pack(s, {**row, "task_idx": 3}, shared)
    assert info.value.field == "raw_task.task_idx"
    with pytest.raises(InvalidArgument, match="share its hidden environment"):
        open_pack(s, {**row, "pack_seed": 98, "task_idx": 2}, shared)
    # the same pack seed draws the same equation
    other, _ = open_pack(s, {**row, "task_idx": 0}, {})
    assert other.equation == pack.equation


def test_a_row_without_task_idx_takes_the_next_position_and_the_environment_seed_wins() -> None:
    s = PdeSettings.from_args(SMALL)
    shared: dict[str, Any] = {}
    first, one = open_pack(s, {"seed": 5, "pack_seed": 1, "pde_environment_seed": 40}, shared)
    _, two = open_pack(s, {"seed": 6, "pack_seed": 2, "pde_environment_seed": 40}, shared)
    assert (one, two) == (1, 2) and first.environment_seed == 40
    index_row = {"seed": 5, "pde_environment_seed": 40, "ground_truth_template_index": 0, "task_idx": 0}
    fixed, _ = open_pack(s, index_row, {})
    assert list(fixed.equation) == ["u"] and fixed.equation["u"] < 0  # small_demo's first template
