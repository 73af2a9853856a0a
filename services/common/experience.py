"""Domain types for the unit of training data (Experience) and of work (Task).

Plain dataclasses over numpy arrays: the buffer stores them without importing torch, the trainer
turns them into tensors, and services/common/wire.py converts them to and from protobuf.
Token-level arrays cover the response only: `tokens[prompt_length:]` aligns with `logprobs`,
`action_mask` and the optional per-token arrays (as in Trinity-RFT).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument
from services.common.values import check_reward, non_finite_message


@dataclass
class ChatMessage:
    role: str
    content: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Experience:
    """One trajectory (or turn) ready for training.

    tokens: int32/int64 [prompt + response]; logprobs: float32 [response] (None: the trainer
    recomputes them); action_mask: bool [response] (None: all ones); reward: scalar;
    model_version: weights that generated it (0 = base model).
    """

    tokens: np.ndarray
    prompt_length: int
    model_version: int
    reward: float | None = None
    logprobs: np.ndarray | None = None
    action_mask: np.ndarray | None = None
    token_level_rewards: np.ndarray | None = None
    advantages: np.ndarray | None = None
    returns: np.ndarray | None = None
    task_id: str = ""
    run_id: int = 0
    step: int = 0
    group_id: str = ""
    batch_id: int = 0
    producer: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    messages: list[ChatMessage] = field(default_factory=list)
    chosen: np.ndarray | None = None
    rejected: np.ndarray | None = None
    is_eval: bool = False
    response_text: str = ""
    prompt_text: str = ""
    teacher_logprobs: np.ndarray | None = None

    @property
    def response_length(self) -> int:
        return int(self.tokens.shape[0]) - self.prompt_length

    @property
    def eid(self) -> ExperienceId:
        """Trinity's `exp.eid` (task, run, step, batch) as a view of this experience's id fields."""
        return ExperienceId(self)

    def validate(self, where: str = "experience") -> None:
        """Raise InvalidArgument naming the field when the arrays or scalars are inconsistent."""
        validate_experience(self, where)


class ExperienceId:
    """`exp.eid.task / .run / .step / .batch` read and write task_id, run_id, step, batch_id."""

    _FIELDS = {"task": "task_id", "run": "run_id", "step": "step", "batch": "batch_id"}

    def __init__(self, exp: Experience) -> None:
        object.__setattr__(self, "_exp", exp)

    def __getattr__(self, name: str) -> Any:
        if name not in self._FIELDS:
            raise AttributeError(f"eid has no {name!r}; it has {', '.join(self._FIELDS)}")
        return getattr(self._exp, self._FIELDS[name])

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._FIELDS:
            raise AttributeError(f"eid has no {name!r}; it has {', '.join(self._FIELDS)}")
        setattr(self._exp, self._FIELDS[name], value)


_RESPONSE_ARRAYS = (
    "logprobs",
    "action_mask",
    "token_level_rewards",
    "advantages",
    "returns",
    "teacher_logprobs",
)


def validate_experience(exp: Experience, where: str = "experience") -> None:
    """Check shapes, ranges and finiteness. Chat-only experiences (messages, no tokens) are valid."""
    if exp.model_version is None or exp.model_version < 0:
        raise InvalidArgument("model_version is required and must be >= 0", field=f"{where}.model_version")
    if exp.reward is not None:
        check_reward(exp.reward, f"{where}.reward")
    n = int(exp.tokens.shape[0]) if exp.tokens is not None else 0
    if n == 0:
        if not exp.messages and exp.chosen is None:
            raise InvalidArgument(
                "an experience needs tokens, messages or chosen/rejected", field=f"{where}.tokens"
            )
        return
    if exp.tokens.ndim != 1:
        raise InvalidArgument(f"tokens must be 1-D, got shape {exp.tokens.shape}", field=f"{where}.tokens")
    if exp.tokens.dtype.kind not in "iu":
        raise InvalidArgument(
            f"tokens must be int32 or int64, got {exp.tokens.dtype}", field=f"{where}.tokens"
        )
    if not 0 <= exp.prompt_length < n:
        raise InvalidArgument(
            f"prompt_length must be in [0, {n}) for {n} tokens, got {exp.prompt_length}",
            field=f"{where}.prompt_length",
        )
    response = n - exp.prompt_length
    for name in _RESPONSE_ARRAYS:
        arr = getattr(exp, name)
        if arr is None or arr.shape[0] == 0:
            continue
        if arr.shape[0] != response:
            raise InvalidArgument(
                f"length {arr.shape[0]} does not match the response length {response} "
                f"(len(tokens) {n} - prompt_length {exp.prompt_length})",
                field=f"{where}.{name}",
            )
        if name != "action_mask" and not np.isfinite(arr).all():
            raise InvalidArgument(non_finite_message(arr), field=f"{where}.{name}")


@dataclass
class Task:
    """One row of a taskset plus how to run it (Trinity's Task)."""

    workflow: str = ""
    reward_fn: str = ""
    raw_task: dict[str, Any] = field(default_factory=dict)
    format_args: dict[str, Any] = field(default_factory=dict)
    rollout_args: dict[str, Any] = field(default_factory=dict)
    workflow_args: dict[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    task_id: str = ""
    index: int = 0
    taskset: str = ""
    repeat_times: int = 1
