"""The real-agentscope suite: AgentScope workflows run on the builtin tiny model through the explorer's
OpenAI-compatible endpoint.

agentscope is not a dependency of the project (the workflows import it lazily; it pulls ~100
packages), so this suite runs in its own venv: `make test-agentscope` builds .venv-agentscope
(agentscope 1.x next to .venv's packages) and runs it; `make test` leaves it out, as it leaves out
tests/vllm. Run anywhere else it fails at once, naming how to get agentscope, instead of skipping.
"""

from __future__ import annotations

import importlib.util

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("agentscope") is None:
        raise pytest.UsageError(
            "tests/agentscope needs agentscope 1.x: run `make test-agentscope` (its own venv, .venv-agentscope)"
        )
