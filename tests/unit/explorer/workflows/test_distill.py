"""on_policy_distill(_math)_workflow: teacher logprobs line up with the response; math accuracy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import InvalidArgument
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.math_eval import eval_accuracy


def wrapper(name: str) -> Any:
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer(name)
    engine = BatchingEngine(
        TransformersEngine(load_causal_lm(name), eos_token_ids=[tok.eos_token_id], pad_token_id=0)
    )
    return ModelWrapper(engine, tok, max_response_tokens=6)


def task(name: str = "on_policy_distill_workflow", **changes: Any) -> Task:
    values: dict[str, Any] = {
        "workflow": WORKFLOWS.get(name),
        "raw_task": {"q": "12+30=", "a": "42"},
        "format_args": FormatConfig(prompt_key="q", response_key="a", prompt_type="plaintext"),
        "task_id": "0",
    }
    values.update(changes)
    t = Task(**values)
    t.rollout_args.n = 2
    return t


async def test_teacher_logprobs_are_the_teachers_scores_of_the_response_tokens() -> None:
    from services.explorer.engines.transformers_engine import sequence_logprobs
    from services.models.loading import load_causal_lm

    student, teacher = wrapper("builtin:tiny-arith"), wrapper("builtin:tiny-30m")
    try:
        flow = task().to_workflow(student, [teacher])
        exps = await flow.run_async()
    finally:
        student.engine.close()
        teacher.engine.close()
    reference = load_causal_lm("builtin:tiny-30m")
    assert len(exps) == 2
    for exp in exps:
        want = sequence_logprobs(reference, exp.tokens.tolist(), exp.prompt_length)
        assert exp.teacher_logprobs is not None and exp.teacher_logprobs.shape == exp.logprobs.shape
        assert np.allclose(exp.teacher_logprobs, want, atol=1e-4)
        kl = float((exp.logprobs - exp.teacher_logprobs).sum())
        assert exp.metrics["kl_divergence"] == pytest.approx(kl, abs=1e-4) and exp.reward == 0.0


def test_a_teacher_is_required() -> None:
    student = wrapper("builtin:tiny-arith")
    try:
        with pytest.raises(InvalidArgument) as err:
            task().to_workflow(student, [])
    finally:
        student.engine.close()
    assert err.value.field == "explorer.auxiliary_models"


@pytest.mark.parametrize(
    ("reply", "truth", "score"),
    [
        (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{3} then \boxed{4}", "4", 1.0),  # the last box counts
        ("it is 1,000 apples", "1000", 1.0),  # no box: the last number
        ("7 or 8", "7", 0.0),
        ("no number", "7", 0.0),
        (r"\boxed{x+1}", r"\boxed{1+x}", 1.0),
    ],
)
def test_math_accuracy(reply: str, truth: str, score: float) -> None:
    assert eval_accuracy(reply, truth) == score  # what on_policy_distill_math_workflow scores with


def test_math_variant_asks_qwen_math_style() -> None:
    flow_cls = WORKFLOWS.get("on_policy_distill_math_workflow")
    flow = flow_cls.__new__(flow_cls)
    flow.question = "1+1?"
    assert flow.format_messages() == [
        {"role": "system", "content": "You are a helpful assistant."},
        {
            "role": "user",
            "content": "1+1?\nPlease reason step by step, and put your final answer within \\boxed{}.",
        },
    ]
