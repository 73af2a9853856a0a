"""CoD environments Trinity names in its v0.6 example configs but has not published.

Trinity's research CoD README lists `cod_random_alchemy_workflow` (Alchemy-Random: a hidden crafting
recipe, which elements combine into which new element) and `cod_terminal_workflow` (Terminal: how
commands and paths behave, where files lie) beside the three environments implemented here. Their
code and their data generators (examples/research_cod/get_alchemy_data.py, get_terminal_data.py) sit on
Trinity's `research/cod_v2` branch, which is in neither v0.5.2 nor its main branch's
trinity/common/workflows/connect_the_dots: there is no published task-row format, rule set or reward to
implement them against. So the names are known here, and `preflight` (what `trinity config check`
and `trinity run` report) says why they cannot run and what to do instead: port the environment as a
`CodEpisodeWorkflow` subclass in `explorer.plugin_dirs` under the same name (docs/workflows.md).
"""

from __future__ import annotations

from typing import Any

from services.common.errors import FailedPrecondition
from services.explorer.workflows.base import Task
from services.explorer.workflows.cod.episode import CodEpisodeWorkflow

WHERE = (
    "its environment and data generator are on Trinity-RFT's research/cod_v2 branch, not in a release "
    "(v0.5.2) or its main branch, so no task-row format or reward rule is published to implement"
)
INSTEAD = (
    "port it as a CodEpisodeWorkflow subclass (services/explorer/workflows/cod/episode.py) registered under "
    "this name from a module in explorer.plugin_dirs, or train on cod_frozenlake_obscure_workflow, "
    "cod_grid_navigation_workflow or cod_optimalcontrol_workflow"
)


class UnpublishedCodWorkflow(CodEpisodeWorkflow):
    """A CoD environment known by name only (see the module docstring)."""

    environment = ""
    registered_name = ""

    @classmethod
    def problem(cls) -> str:
        return f"{cls.registered_name} ({cls.environment}) cannot run here: {WHERE}; {INSTEAD}"

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        return [*super().preflight(workflow_args), cls.problem()]

    def setup(self, task: Task) -> None:
        raise FailedPrecondition(self.problem())


class CodRandomAlchemyWorkflow(UnpublishedCodWorkflow):
    environment = "Alchemy-Random: a hidden recipe of which elements combine into which new one"
    registered_name = "cod_random_alchemy_workflow"


class CodTerminalWorkflow(UnpublishedCodWorkflow):
    environment = "Terminal: how a sandbox's commands and paths behave and where its files lie"
    registered_name = "cod_terminal_workflow"
