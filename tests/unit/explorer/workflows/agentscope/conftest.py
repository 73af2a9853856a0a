"""Fixtures of the AgentScope workflow tests: the real tiny model behind the OpenAI API, agentscope
hidden (or pretended), task building."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from services.common.config.buffer import FormatConfig
from services.explorer.engines.base import BatchingEngine
from services.explorer.engines.transformers_engine import TransformersEngine
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.agentscope_support import (
    AGENTSCOPE_V1_INSTALL,
)
from services.models.loading import load_causal_lm, load_tokenizer

V1 = AGENTSCOPE_V1_INSTALL


@pytest.fixture
def wrapper() -> Iterator[ModelWrapper]:
    tok = load_tokenizer("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"),
            eos_token_ids=[tok.eos_token_id],
            pad_token_id=tok.pad_token_id,
        )
    )
    model = ModelWrapper(
        engine, tok, max_prompt_tokens=200, max_response_tokens=8, enable_history=True, model_name="tiny"
    )
    yield model
    model.close()
    engine.close()


@pytest.fixture
def no_agentscope(monkeypatch: pytest.MonkeyPatch) -> None:
    """agentscope absent, whatever this environment has (stand-in agents need no version check either)."""
    real_spec, real_version = importlib.util.find_spec, importlib.metadata.version

    def version(name: str) -> str:
        if name == "agentscope":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "agentscope" else real_spec(name, *a)
    )
    monkeypatch.setattr(importlib.metadata, "version", version)


def installed(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """Pretend agentscope `version` is installed (only the checks look; nothing imports it)."""
    real_spec, real_version = importlib.util.find_spec, importlib.metadata.version
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "agentscope" else real_spec(name, *a),
    )
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: version if name == "agentscope" else real_version(name)
    )


def task_for(name: str, raw: dict[str, Any], **changes: Any) -> Task:
    workflow = changes.pop("workflow", None) or WORKFLOWS.get(name)
    task = Task(
        workflow=workflow,
        raw_task=raw,
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        task_id="t1",
    )
    for key, value in changes.items():
        setattr(task, key, value)
    return task
