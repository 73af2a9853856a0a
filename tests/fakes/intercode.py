"""A scripted stand-in for InterCode's SqlEnv (same calls: reset(idx), step(action), close())."""

from __future__ import annotations

from typing import Any


class ScriptedSqlEnv:
    """Answers each step with the next scripted (observation, reward, done, info); records actions.

    Like SqlEnv it exposes the question (`query`) and its record (`record`) after reset.
    """

    def __init__(
        self,
        outcomes: list[tuple[Any, float, bool, dict[str, Any]]],
        *,
        query: str = "How many singers are there?",
        record: dict[str, Any] | None = None,
    ) -> None:
        self.outcomes = list(outcomes)
        self.query = query
        self.record = record if record is not None else {"db": "concert_singer"}
        self.actions: list[str] = []
        self.reset_indices: list[int] = []
        self.closed = False

    def reset(self, index: int) -> tuple[str, dict[str, Any]]:
        self.reset_indices.append(index)
        return "", {}

    def step(self, action: str) -> tuple[Any, float, bool, dict[str, Any]]:
        self.actions.append(action)
        if not self.outcomes:
            raise AssertionError(f"the script has no outcome for action {action!r}")
        return self.outcomes.pop(0)

    def close(self) -> None:
        self.closed = True
