"""The CoD environments Trinity's configs name but has not published: known by name, refused with why."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.errors import FailedPrecondition
from services.common.registry import Registry
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.cod.unpublished import (
    CodRandomAlchemyWorkflow,
    CodTerminalWorkflow,
)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("cod_random_alchemy_workflow", CodRandomAlchemyWorkflow),
        ("cod_terminal_workflow", CodTerminalWorkflow),
    ],
)
def test_the_names_resolve_and_preflight_says_why_they_cannot_run(name: str, cls: Any) -> None:
    assert WORKFLOWS.get(name) is cls
    problems = cls.preflight({"agent_max_steps": 12})
    assert len(problems) == 1
    assert problems[0].startswith(f"{name} (")
    assert "research/cod_v2" in problems[0] and "explorer.plugin_dirs" in problems[0]


def test_building_an_episode_is_refused_with_the_same_reason() -> None:
    task = Task(workflow=CodTerminalWorkflow, workflow_args={}, raw_task={}, task_id="t")
    with pytest.raises(FailedPrecondition, match="cod_terminal_workflow .*research/cod_v2"):
        CodTerminalWorkflow(task=task, model=None)


def test_a_plugin_port_under_the_same_name_shadows_the_refusal() -> None:
    registry = Registry(
        "workflow",
        builtins={
            "cod_random_alchemy_workflow": "services.explorer.workflows.cod.unpublished:CodRandomAlchemyWorkflow"
        },
        config_key="default_workflow_type",
    )

    class Port(CodRandomAlchemyWorkflow):
        @classmethod
        def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
            return []

    registry.register_module("cod_random_alchemy_workflow", Port)
    assert registry.get("cod_random_alchemy_workflow") is Port
