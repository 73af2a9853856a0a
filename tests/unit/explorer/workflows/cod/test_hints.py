"""The CoD hint update: parsing the hint block and its length-shaped reward, worked by hand."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.config.cod import CodWorkflowArgs
from services.explorer.workflows.cod.hints import (
    HINT_END,
    HINT_START,
    NO_HINT,
    extract_hint,
    hint_reward,
    update_hints,
)


def test_extract_hint() -> None:
    assert extract_hint(f"thinking\n{HINT_START}\n- code 1 is up\n{HINT_END}") == (
        "Hints: - code 1 is up",
        True,
    )
    assert extract_hint("no block") == (NO_HINT, False)
    assert extract_hint(f"{HINT_START}\n  \n{HINT_END}") == (NO_HINT, False)  # empty block
    # two blocks, or the markers out of order: ambiguous, not parsed (Trinity's strict rule)
    assert extract_hint(f"{HINT_START}a{HINT_END} then {HINT_START}b{HINT_END}") == (NO_HINT, False)
    assert extract_hint(f"{HINT_END} a {HINT_START}") == (NO_HINT, False)


def test_hint_reward() -> None:
    args = CodWorkflowArgs(hint_penalty_coef=0.1)
    assert hint_reward(False, 5, args) == pytest.approx(-0.1)
    assert hint_reward(True, 10_000, args) == 0.0  # no ramp set: no length penalty
    ramp = CodWorkflowArgs(
        hint_penalty_coef=0.1, len_zero_penalty=100, len_max_penalty=300, len_min_penalty=10
    )
    assert hint_reward(True, 200, ramp) == pytest.approx(-0.05)  # (200 - 100) / 200 = 0.5
    assert hint_reward(True, 50, ramp) == 0.0 and hint_reward(True, 900, ramp) == pytest.approx(-0.1)
    assert hint_reward(True, 5, ramp) == pytest.approx(-0.1)  # below len_min_penalty


async def test_update_hints_one_call(make_model: Any) -> None:
    model, engine = make_model([f"ok\n{HINT_START}\n- 4 is right\n{HINT_END}"])
    args = CodWorkflowArgs(hint_example=True, max_response_tokens_restraint=50, hint_penalty_coef=0.1)
    exp = await update_hints(
        model, args, {"temperature": 1.0}, previous="Hints: null", trajectory="T", reward=1.0, feedback="won"
    )
    assert exp.info["hint"] == "Hints: - 4 is right" and exp.info["prev_hint"] == "Hints: null"
    assert exp.reward == 0.0 and exp.metrics["hint_parse_success"] == 1.0
    system, user = exp.messages[0].content, exp.messages[1].content
    assert "For example" in system and "under 50 tokens" in system
    assert "Hints: null" in user and "Reward: 1.000" in user and "Environment feedback: won" in user


async def test_the_pde_update_hides_the_reward_and_repeats_the_format(make_model: Any) -> None:
    model, _ = make_model([f"{HINT_START}\n- u**3 damps\n{HINT_END}"])
    exp = await update_hints(
        model, CodWorkflowArgs(), {}, previous="Hints: null", trajectory="T", reward=0.75, feedback="fit 0.1",
        impl="pde_update_context",
    )  # fmt: skip
    user = exp.messages[1].content
    assert "Reward:" not in user and "0.75" not in user and "Environment feedback: fit 0.1" in user
    assert user.rstrip().endswith("nothing may\nfollow the second one.") and f"{HINT_START}\n- your" in user
    assert exp.info["hint"] == "Hints: - u**3 damps"
