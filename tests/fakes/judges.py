"""Fakes for the judge workflows' unit tests: a canned policy, a fake OpenAI judge client, task building."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from services.common.config.buffer import FormatConfig
from services.common.experience import Experience
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.base import RolloutArgs

# --- fakes -------------------------------------------------------------------------------------


class ScriptedModel:
    """The policy: call i answers with script[i] (the last list repeats); records every call."""

    def __init__(self, *script: list[str]) -> None:
        self.script = list(script)
        self.calls: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> list[Experience]:
        replies = self.script[min(len(self.calls), len(self.script) - 1)]
        self.calls.append((messages, kwargs))
        return [
            Experience(tokens=np.arange(3 + len(r)), prompt_length=3, model_version=0, response_text=r)
            for r in replies
        ]

    async def chat_async(self, messages: list[dict[str, str]], **kwargs: Any) -> list[Experience]:
        return self.chat(messages, **kwargs)


class FakeJudge:
    """An OpenAI client's chat.completions.create: answers with the canned replies in turn."""

    model_path = "judge-model"

    def __init__(self, *replies: str | None) -> None:
        self.replies = list(replies)
        self.calls: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs: Any) -> Any:
        reply = self.replies[min(len(self.calls), len(self.replies) - 1)]
        self.calls.append(kwargs)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=reply))])


def make_task(name: str, raw: dict[str, Any] | None = None, n: int = 2, **changes: Any) -> Task:
    task = Task(
        workflow=WORKFLOWS.get(name),
        raw_task=raw or {"question": "What is 2+2?", "answer": "4"},
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=RolloutArgs(n=n, temperature=1.0, logprobs=0),
        task_id="t0",
    )
    for key, value in changes.items():
        setattr(task, key, value)
    return task
