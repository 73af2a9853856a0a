"""What happens to a prompt longer than model.max_prompt_tokens (model.enable_prompt_truncation).

Engine-agnostic: ModelWrapper asks `PromptFit.plan` before it hands token ids to any engine
(transformers or vLLM), so both engines see the same prompts and the same response budgets.

- truncation on (the default): the prompt keeps its last max_prompt_tokens tokens and is generated on.
- truncation off (Trinity's `enable_prompt_truncation: false`): the prompt is not cut. It is generated
  on whole when the context (`context_len`: max_model_len) still holds it and one response token;
  the response budget shrinks to what the context has left, so prompt + response always fit the
  trainer's rows (which refuse anything past max_model_len). A prompt that leaves no room is kept as
  Trinity keeps an over-long prompt: an experience of its first max_prompt_tokens tokens and one
  response token, with a zero action mask and `truncate_status: prompt_truncated` in its info, so the
  sample is counted (reward, group size) but moves no weight. Nothing is generated for it.

Every experience of an over-long prompt carries `info["prompt_overlong"] = 1`; step metrics count
them (`rollout/prompt_overlong`) and the masked ones (`rollout/prompt_masked`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PROMPT_TRUNCATED = "prompt_truncated"
"""Trinity's truncate_status of an experience masked out for its over-long prompt."""
MASKED_RESPONSE_TEXT = "[This experience is masked out due to overlong prompt]"
"""The response text of a masked-out sample (Trinity's wording), which reward functions then score."""


@dataclass(frozen=True)
class PromptPlan:
    """One prompt's fate: `ids` to generate on with at most `max_tokens` new tokens, or `masked`."""

    ids: list[int]
    max_tokens: int
    overlong: bool = False
    masked: bool = False


@dataclass(frozen=True)
class PromptFit:
    """model.max_prompt_tokens, model.enable_prompt_truncation and the context length (max_model_len)."""

    max_prompt_tokens: int
    truncate: bool = True
    context_len: int | None = None
    """Tokens of prompt + response the engine and the trainer take; None: no limit but the prompt's."""

    def plan(self, ids: list[int], max_tokens: int) -> PromptPlan:
        """The plan for token ids `ids` (not yet truncated) and a response budget of `max_tokens`."""
        if len(ids) <= self.max_prompt_tokens:
            return PromptPlan(ids, max_tokens)
        if self.truncate:
            return PromptPlan(ids[-self.max_prompt_tokens :], max_tokens, overlong=True)
        room = max_tokens if self.context_len is None else min(max_tokens, self.context_len - len(ids))
        if room >= 1:
            return PromptPlan(ids, room, overlong=True)
        head = (
            self.max_prompt_tokens
            if self.context_len is None
            else min(self.max_prompt_tokens, self.context_len - 1)
        )
        return PromptPlan(ids[: max(head, 1) + 1], 0, overlong=True, masked=True)

    def token_limit(self) -> int:
        """The longest token prompt a multi-turn workflow may hand in (generate_tokens)."""
        if self.truncate or self.context_len is None:
            return self.max_prompt_tokens
        return max(self.max_prompt_tokens, self.context_len - 1)


def masked_arrays(plan: PromptPlan) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(tokens, prompt_length, logprobs, action_mask) of a masked-out sample: the first
    max_prompt_tokens tokens as its prompt, the next one as a one-token response that trains nothing."""
    tokens = np.asarray(plan.ids, dtype=np.int64)
    prompt_length = len(tokens) - 1
    return tokens, prompt_length, np.zeros(1, dtype=np.float32), np.zeros(1, dtype=bool)
