"""LLM-judge workflows with a real judge: an auxiliary model built by build_auxiliary and asked over HTTP.

The judge and the policy are both the builtin tiny-arith model (no download). The judge's replies
are gibberish, so this checks the plumbing, not judgement: every judge call reached the judge's
OpenAI-compatible server on loopback with the prompt built from the policy's answers, each reply
was read as `parse_score_list` / `parse_rubric_rating` read it (unreadable: reward 0 and
judge_success 0), rewards lie in [0, 1], and the experiences are well formed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.common.config import validate_config
from services.common.config.buffer import FormatConfig
from services.explorer.build import build_auxiliary
from services.explorer.engines.base import BatchingEngine
from services.explorer.engines.transformers_engine import TransformersEngine
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.base import RolloutArgs
from services.explorer.workflows.judging import (
    format_rubric,
    parse_rubric_rating,
    parse_score_list,
    rubric_messages,
    ruler_messages,
)
from services.models.loading import load_causal_lm, load_tokenizer

RUBRIC = [{"description": "States the sum", "weight": 1}]


@pytest.fixture
def judge() -> Any:
    """explorer.auxiliary_models[0] as the explorer builds it, recording the calls it serves."""
    cfg = validate_config(
        {
            "model": {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 64, "max_response_tokens": 8},
            "explorer": {
                "auxiliary_models": [
                    {"model_path": "builtin:tiny-arith", "max_prompt_tokens": 200, "max_response_tokens": 24}
                ]
            },
        }
    )
    wrappers, owned = build_auxiliary(cfg)
    [wrapper] = wrappers
    wrapper.enable_history = True  # every chat the HTTP server serves is recorded here
    yield wrapper
    for part in owned:
        part.close()


def task(name: str, question: str, answer: str, repeat_times: int, **raw: Any) -> Task:
    return Task(
        workflow=WORKFLOWS.get(name),
        repeat_times=repeat_times,
        raw_task={"question": question, "answer": answer, **raw},
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=RolloutArgs(n=1, temperature=1.0),
        task_id=name,
    )


def judge_calls(wrapper: ModelWrapper) -> list[tuple[list[dict[str, str]], str]]:
    """(messages, reply) of every call the judge served, in order."""
    return [
        ([{"role": m.role, "content": m.content} for m in exp.messages[:-1]], exp.response_text)
        for exp in wrapper.extract_experience_from_history()
    ]


def check_well_formed(exps: list[Any], count: int, version: int) -> None:
    assert len(exps) == count
    for exp in exps:
        assert 0 < exp.prompt_length < len(exp.tokens) <= exp.prompt_length + 8
        assert exp.logprobs.shape == (exp.response_length,) and np.isfinite(exp.logprobs).all()
        assert exp.model_version == version and 0.0 <= exp.reward <= 1.0
        assert 0.0 <= exp.metrics["judge_success"] <= 1.0


async def test_ruler_and_rubric_judges_over_http(judge: ModelWrapper) -> None:
    tok = load_tokenizer("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"), eos_token_ids=[tok.eos_token_id], pad_token_id=0
        )
    )
    engine.engine.model_version = 2  # holds version 2, as after the explorer loaded it
    try:
        runner = WorkflowRunner(
            # the policy's system prompt is longer than the tiny model's 256 positions: keep its tail
            lambda i: ModelWrapper(engine, tok, max_prompt_tokens=200, max_response_tokens=8),
            slots=1,  # one task at a time: the judge's calls come in task order
            max_timeout=120,
            max_retry_times=0,
            version_fn=VersionRef(2),
            auxiliary_models=[judge],  # as the explorer hands them over (base.Workflow makes the clients)
        )
        client = WORKFLOWS.get("math_ruler_workflow")(
            task=task("math_ruler_workflow", "1+1=", "2", 1), model=None, auxiliary_models=[judge]
        ).judge
        assert str(client.base_url).startswith("http://127.0.0.1:")

        ruler, async_ruler, rubric = await runner.run_tasks(
            [
                task("math_ruler_workflow", "12+30=", "42", 3),
                task("async_math_ruler_workflow", "5+5=", "10", 2),
                task("rubric_judge_workflow", "7+1=", "8", 2, rubric=RUBRIC),
            ]
        )
        calls = judge_calls(judge)
        assert len(calls) == 1 + 1 + 2  # one RULER call per group, one rubric call per answer
        for result, question, (messages, reply) in (
            (ruler, "12+30=", calls[0]),
            (async_ruler, "5+5=", calls[1]),
        ):
            assert not result.skipped, result.errors
            exps = result.experiences
            check_well_formed(exps, len(exps), 2)
            assert messages == ruler_messages(question, [e.response_text for e in exps])
            scores = parse_score_list(reply, len(exps))
            assert scores is None, f"the tiny judge wrote a score list: {reply!r}"
            assert [e.reward for e in exps] == [0.0] * len(exps)  # Trinity's fallback
            assert [e.metrics["judge_success"] for e in exps] == [0.0] * len(exps)
            assert all(e.metrics["accuracy"] in (0.0, 1.0) and "gold_reward" in e.metrics for e in exps)

        assert not rubric.skipped, rubric.errors
        check_well_formed(rubric.experiences, 2, 2)
        for exp, (messages, reply) in zip(rubric.experiences, calls[2:], strict=True):
            assert messages == rubric_messages("7+1=", exp.response_text, format_rubric(RUBRIC))
            rating = parse_rubric_rating(reply)
            assert exp.reward == (0.0 if rating is None else rating)
        readable = sum(parse_rubric_rating(reply) is not None for _, reply in calls[2:]) / 2
        assert [e.metrics["judge_success"] for e in rubric.experiences] == [readable, readable]
    finally:
        engine.close()
