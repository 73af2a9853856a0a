"""Fixtures of the unit tests: a real model for workflow tests whose prompts do not fit tiny-arith
(builtin tiny-30m), and `make_model` (the real ModelWrapper over a scripted engine) for the
environment workflows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def tiny_30m() -> Iterator[tuple[Any, Any]]:
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer("builtin:tiny-30m")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-30m"), eos_token_ids=[tok.eos_token_id], pad_token_id=0
        )
    )
    yield engine, tok
    engine.close()


@pytest.fixture
def make_model() -> Iterator[Any]:
    """make_model(replies, **wrapper_kwargs) -> (ModelWrapper, ScriptedEngine); all closed afterwards."""
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import builtin_tokenizer
    from tests.fakes.env_workflows import ScriptedEngine

    opened: list[Any] = []

    def build(replies: list[str], **kwargs: Any) -> tuple[Any, Any]:
        tok = builtin_tokenizer()
        scripted = ScriptedEngine(tok, replies)
        engine = BatchingEngine(scripted)
        model = ModelWrapper(engine, tok, max_prompt_tokens=16384, max_response_tokens=512, **kwargs)
        opened.extend([model, engine])
        return model, scripted

    yield build
    for thing in opened:
        thing.close()
