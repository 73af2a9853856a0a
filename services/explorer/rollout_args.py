"""The rollout args a workflow may pass to a model (Trinity's / vLLM's names): which ones sample,
which ones are accepted and ignored, and the check both model kinds run (ModelWrapper for the
engines, ExternalChatModel for a remote chat API)."""

from __future__ import annotations

from collections.abc import Iterable

from services.common.errors import InvalidArgument

SAMPLING_KEYS = frozenset({"n", "temperature", "top_p", "top_k", "max_tokens", "min_tokens"})
"""Rollout args that change how tokens are sampled."""
IGNORED_KEYS = frozenset(
    {
        "logprobs",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "max_completion_tokens",
    }
)
"""Accepted for compatibility, no effect here (logprobs are always recorded; max_completion_tokens is
read as max_tokens when that is absent)."""


def check_rollout_args(keys: Iterable[str]) -> None:
    """Unknown keys are an error naming them and the allowed ones, never silently dropped."""
    unknown = set(keys) - SAMPLING_KEYS - IGNORED_KEYS
    if unknown:
        raise InvalidArgument(
            f"unknown rollout args {sorted(unknown)}; allowed: {sorted(SAMPLING_KEYS)}",
            field="rollout_args",
        )
