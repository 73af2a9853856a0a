"""model.enable_prompt_truncation: false on the real vLLM engine: the ModelWrapper's plan
(services/explorer/prompt_fit.py, unit-tested in tests/unit/explorer/) keeps over-long prompts whole
within vLLM's max_model_len (256 here) and masks out the one vLLM could not take."""

from __future__ import annotations

from services.explorer.engines.base import BatchingEngine
from services.explorer.engines.vllm_engine import VLLMEngine
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.prompt_fit import PROMPT_TRUNCATED
from services.models.loading import builtin_tokenizer

TOK = builtin_tokenizer()


def test_whole_prompts_fill_vllms_context_and_a_longer_one_is_masked(tiny_engine: VLLMEngine) -> None:
    wrapper = ModelWrapper(
        BatchingEngine(tiny_engine, name="vllm-prompt-fit"),
        TOK,
        max_prompt_tokens=8,
        max_response_tokens=10,
        enable_prompt_truncation=False,
        max_model_len=256,
    )
    fits, overflows = "1+" * 125, "1+" * 150  # 250 and 300 tokens
    assert len(wrapper.tokenize(fits)) == 250
    whole, masked = wrapper.generate([fits, overflows], max_tokens=10, min_tokens=10, temperature=0.0)
    # 250 prompt tokens kept whole; vLLM's 256 positions leave 6 of the 10 response tokens
    assert whole.prompt_length == 250 and whole.response_length == 6
    assert whole.action_mask is not None and masked.action_mask is not None
    assert whole.tokens[:250].tolist() == wrapper.tokenize(fits) and whole.action_mask.all()
    assert whole.info["prompt_overlong"] == 1
    # 300 tokens would be refused by vLLM: kept as Trinity's masked sample, never sent
    assert masked.info["truncate_status"] == PROMPT_TRUNCATED
    assert masked.prompt_length == 8 and masked.tokens.tolist() == wrapper.tokenize(overflows)[:9]
    assert masked.action_mask.tolist() == [False]
