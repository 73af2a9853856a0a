"""Fixtures of the unit tests: a real model for workflow tests whose prompts do not fit tiny-arith (builtin tiny-30m)."""

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
