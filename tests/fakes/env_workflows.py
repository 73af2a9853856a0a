"""Shared pieces of the environment-workflow tests: the real ModelWrapper over a scripted engine,
decoding helpers, task building and hiding/pretending packages for preflight checks.

Replies are canned, on the character-level builtin tokenizer, so token counts are character counts.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from services.common.config.buffer import FormatConfig
from services.common.experience import Experience
from services.explorer.engines.base import GenerationOutput, InferenceEngine, SamplingParams
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.workflows import WORKFLOWS, RolloutArgs, Task

LOGPROB = -0.5  # every scripted token's sampling logprob

# --- the model: the real wrapper over an engine that replays canned replies ---------------------


class ScriptedEngine(InferenceEngine):
    """Answers each prompt with the next canned reply (its characters, then <eos>); records prompts."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    def generate_batch(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            reply = self.replies.pop(0)
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            response = np.asarray(ids, dtype=np.int64)
            logprobs = np.full(len(ids), LOGPROB, dtype=np.float32)
            out.append([GenerationOutput(list(prompt), response, logprobs, "stop")])
        return out

    def update_weights(self, named_tensors: Any) -> None:
        pass


def decode(model: ModelWrapper, ids: Any) -> str:
    return str(model.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False))


def model_text(model: ModelWrapper, exp: Experience) -> str:
    """The response tokens under action mask 1, decoded."""
    response = exp.tokens[exp.prompt_length :]
    assert exp.action_mask is not None
    return decode(model, response[exp.action_mask])


def other_text(model: ModelWrapper, exp: Experience) -> str:
    response = exp.tokens[exp.prompt_length :]
    assert exp.action_mask is not None
    return decode(model, response[~exp.action_mask])


def make_task(name: str, raw: dict[str, Any], *, prompt_key: str, **changes: Any) -> Task:
    task = Task(
        workflow=WORKFLOWS.get(name),
        raw_task=raw,
        format_args=FormatConfig(prompt_key=prompt_key),
        rollout_args=RolloutArgs(n=1, temperature=1.0, top_p=1.0, top_k=-1, logprobs=0),
        task_id="t0",
    )
    for key, value in changes.items():
        setattr(task, key, value)
    return task


def hide_packages(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """importlib.util.find_spec answers None for `names` (packages absent), the truth for the rest."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name.split(".")[0] in names else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def pretend_packages(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return SimpleNamespace(submodule_search_locations=None) if name in names else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def stand_in(workflow_cls: type, env: Any) -> type:
    """A subclass of `workflow_cls` whose make_env returns `env` (and records the arguments)."""

    class WithStandIn(workflow_cls):  # type: ignore[misc, valid-type]
        made: list[Any] = []

        @classmethod
        def make_env(cls, *args: Any) -> Any:
            cls.made.append(args)
            return env

    return WithStandIn
