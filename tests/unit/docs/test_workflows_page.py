"""docs/workflows.md names every registered workflow, reward fn and experience operator, and no other."""

from __future__ import annotations

import re

from services.explorer.pipeline import EXPERIENCE_OPERATORS
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.workflows import WORKFLOWS
from tests.conftest import REPO

DOC = REPO / "docs" / "workflows.md"


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def named(text: str) -> set[str]:
    return set(re.findall(r"`([A-Za-z_0-9]+)`", text))


def test_every_workflow_is_documented() -> None:
    table = section("Workflows").split("Base classes")[0]
    rows = {line for line in table.splitlines() if line.startswith("| `")}
    documented = {name for row in rows for name in named(row.split(" | ")[0])}
    assert documented == set(WORKFLOWS.builtin_names())


def test_every_reward_fn_and_operator_is_documented() -> None:
    rewards = {
        n
        for line in section("Reward functions").splitlines()
        if line.startswith("| `")
        for n in named(line.split(" | ")[0])
    }
    assert rewards == set(REWARD_FUNCTIONS.builtin_names())
    assert set(EXPERIENCE_OPERATORS.builtin_names()) <= named(section("Experience operators"))
