"""Rewards for replies that must equal the truth as text: `exact_match_reward`, `arith_reward`."""

from __future__ import annotations

from typing import Any

from services.explorer.rewards.answers import plain_answer


def exact_match_reward(response: str, truth: str | None = None, **_: Any) -> dict[str, float]:
    """1 when the stripped response equals the stripped truth."""
    return {"accuracy": 1.0 if truth is not None and response.strip() == str(truth).strip() else 0.0}


def arith_reward(response: str, truth: str | None = None, **_: Any) -> dict[str, float]:
    """Embedded demo: 1 when the reply (generation stops at EOS), whitespace removed, equals the answer.

    Compared as text, not as numbers: the zero-padded `0432` is the answer the task asks for.
    """
    if truth is None:
        return {"accuracy": 0.0}
    return {"accuracy": 1.0 if plain_answer(response) == plain_answer(str(truth)) else 0.0}
