"""ModelWrapper over the builtin tiny model's transformers engine: model.enable_prompt_truncation
(explorer/prompt_fit.py) as a workflow, the step metrics and the trainer's batching see it. The
builtin tokenizer is one token per character, so prompt lengths are the strings' lengths."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from services.common.config import validate_config
from services.explorer.build import build_pool, build_runner
from services.explorer.prompt_fit import MASKED_RESPONSE_TEXT, PROMPT_TRUNCATED
from services.explorer.refill import RolloutRow
from services.explorer.runner import VersionRef
from services.explorer.step_metrics import rollout_metrics
from services.models.loading import load_tokenizer
from services.trainer.batching import build_batch

SHORT, LONG, HUGE = "1+2=", "12+34+56+7=", "1+2+3+4+5+6+7+8+9=45"  # 4, 11 and 20 tokens


def _wrapper(truncate: bool) -> Any:
    cfg = validate_config(
        {
            "model": {
                "model_path": "builtin:tiny-arith",
                "max_prompt_tokens": 8,
                "max_response_tokens": 6,
                "max_model_len": 16,
                "enable_prompt_truncation": truncate,
            }
        }
    )
    tokenizer = load_tokenizer(cfg.model.model_path)
    return build_runner(cfg, build_pool(cfg, tokenizer), tokenizer, VersionRef(3), [])._all[0].wrapper


@pytest.fixture(scope="module")
def whole() -> Any:
    return _wrapper(truncate=False)


def test_without_truncation_prompts_stay_whole_and_one_past_the_context_is_masked(whole: Any) -> None:
    assert [len(whole.tokenize(p)) for p in (SHORT, LONG, HUGE)] == [4, 11, 20]
    exps = whole.generate([SHORT, LONG, HUGE], n=2, max_tokens=6, min_tokens=6)
    assert len(exps) == 6
    short, long_, huge = exps[0], exps[2], exps[4]
    assert short.prompt_length == 4 and short.response_length == 6 and "prompt_overlong" not in short.info
    # 11 tokens kept whole: the 16-token context leaves 5 of the 6 response tokens asked for
    assert long_.prompt_length == 11 and long_.response_length == 5 and long_.info["prompt_overlong"] == 1
    assert whole.tokenize(LONG) == long_.tokens[:11].tolist()
    assert long_.action_mask.all() and np.all(long_.logprobs <= 0)
    # 20 tokens cannot fit 16: Trinity's masked sample, 8 prompt tokens + 1, nothing generated
    for exp in exps[4:]:
        assert exp.tokens.tolist() == whole.tokenize(HUGE)[:9] and exp.prompt_length == 8
        assert exp.action_mask.tolist() == [False] and exp.logprobs.tolist() == [0.0]
        assert exp.info["truncate_status"] == PROMPT_TRUNCATED and exp.response_text == MASKED_RESPONSE_TEXT
        assert exp.model_version == 3
    assert huge.info["prompt_overlong"] == 1


def test_the_trainer_takes_the_rows_and_the_masked_one_trains_nothing(whole: Any) -> None:
    exps = whole.generate([LONG, HUGE], max_tokens=6, min_tokens=6)  # no EOS: the context caps it at 5
    for exp in exps:
        exp.reward = 1.0
        exp.validate()
    batch = build_batch(exps, pad_token_id=0, max_length=16)
    assert batch.train.action_mask[0].sum().item() == exps[0].response_length == 5
    assert batch.train.action_mask[1].sum().item() == 0


def test_step_metrics_count_overlong_and_masked_prompts(whole: Any) -> None:
    exps = whole.generate([SHORT, LONG, HUGE], n=2, max_tokens=3)
    rows = [RolloutRow.of(e) for e in exps]
    for sample in (exps, rows):
        metrics = rollout_metrics([], sample, 1.0)
        assert metrics["rollout/prompt_overlong"] == 4.0 and metrics["rollout/prompt_masked"] == 2.0


def test_chat_async_follows_the_same_plan(whole: Any) -> None:
    (masked,) = asyncio.run(whole.chat_async([{"role": "user", "content": HUGE}], max_tokens=2))
    assert (
        masked.info["truncate_status"] == PROMPT_TRUNCATED
        and masked.messages[-1].content == MASKED_RESPONSE_TEXT
    )
    assert whole.prompt_fit.token_limit() == 15
    (turn,) = whole.generate_tokens(whole.tokenize(HUGE)[:15], max_tokens=4)  # a 15-token context: 1 left
    assert turn.prompt_length == 15 and turn.response_length == 1


def test_with_truncation_the_prompt_keeps_its_last_max_prompt_tokens() -> None:
    wrapper = _wrapper(truncate=True)
    (exp,) = wrapper.generate(HUGE, max_tokens=2, min_tokens=2)
    assert exp.tokens[: exp.prompt_length].tolist() == wrapper.tokenize(HUGE)[-8:]
    assert exp.action_mask.all() and exp.response_length == 2 and exp.info["prompt_overlong"] == 1
    assert wrapper.prompt_fit.token_limit() == 8
