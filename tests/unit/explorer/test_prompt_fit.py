"""model.enable_prompt_truncation's plan for an over-long prompt, on numbers worked by hand."""

from __future__ import annotations

import numpy as np

from services.explorer.prompt_fit import PromptFit, masked_arrays

IDS = list(range(10, 20))  # a 10-token prompt


def test_a_prompt_within_max_prompt_tokens_is_untouched_either_way() -> None:
    for truncate in (True, False):
        plan = PromptFit(10, truncate, context_len=16).plan(IDS, 4)
        assert plan.ids == IDS and plan.max_tokens == 4 and not plan.overlong and not plan.masked


def test_truncation_on_keeps_the_last_max_prompt_tokens() -> None:
    plan = PromptFit(6, True, context_len=16).plan(IDS, 4)
    assert plan.ids == [14, 15, 16, 17, 18, 19] and plan.max_tokens == 4
    assert plan.overlong and not plan.masked


def test_truncation_off_keeps_the_prompt_whole_and_shrinks_the_response_to_the_context() -> None:
    fit = PromptFit(6, False, context_len=16)
    roomy = fit.plan(IDS, 4)  # 10 + 4 <= 16: the full budget
    assert roomy.ids == IDS and roomy.max_tokens == 4 and roomy.overlong and not roomy.masked
    tight = fit.plan(IDS, 8)  # 16 - 10 = 6 tokens left
    assert tight.ids == IDS and tight.max_tokens == 6
    last = PromptFit(6, False, context_len=11).plan(IDS, 8)  # one position left: one token
    assert last.max_tokens == 1 and not last.masked


def test_truncation_off_masks_a_prompt_that_leaves_no_room() -> None:
    plan = PromptFit(6, False, context_len=10).plan(IDS, 4)  # 10 tokens fill the 10 positions
    assert plan.masked and plan.overlong and plan.max_tokens == 0
    assert plan.ids == IDS[:7]  # Trinity's dummy: max_prompt_tokens tokens + one as the response
    tokens, prompt_length, logprobs, mask = masked_arrays(plan)
    assert tokens.tolist() == IDS[:7] and prompt_length == 6
    assert logprobs.tolist() == [0.0] and mask.dtype == np.bool_ and mask.tolist() == [False]
    # a context shorter than max_prompt_tokens + 1 bounds the masked row too
    short = PromptFit(8, False, context_len=5).plan(IDS, 4)
    assert short.masked and short.ids == IDS[:5]


def test_token_prompts_may_reach_the_context_without_truncation() -> None:
    assert PromptFit(6, True, context_len=16).token_limit() == 6
    assert PromptFit(6, False, context_len=16).token_limit() == 15
    assert PromptFit(6, False, context_len=None).token_limit() == 6
