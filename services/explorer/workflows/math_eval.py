r"""`math_eval_workflow` / `async_math_eval_workflow`: Trinity-RFT's MathEvalWorkflow (Qwen2.5-Math style).

Each run asks the model once (n 1, temperature 0.6, top_p 0.8, whatever the taskset's rollout_args
say, as in Trinity) with Qwen2.5-Math's `qwen_boxed` prompt: system "You are a helpful assistant.",
user "<question>\nPlease reason step by step, and put your final answer within \boxed{}." The
question is the task's `question` column (Trinity reads that column whatever format.prompt_key
says; here a task without it falls back to format.prompt_key's column). The runner calls run()
repeat_times times, so an eval taskset's k samples are k runs.

The metric is `accuracy`, 1 when the reply's final answer states the truth's, else 0; the reward is
the same number (Trinity leaves the reward unset). No truth: no accuracy, reward unset.
- The reply's answer, in Qwen2.5-Math's order: what the last `boxed` holds (an unclosed box: what
  follows up to `}` or `$`; an empty box: no answer), else the rest of the line after "the answer
  is" / "final answer is" / "答案是", else the last number.
- The truth's answer: its last `\boxed{}`, else what follows its last `####` (GSM8K), else a
  worked solution (several lines) is read like a reply, and a one-line truth is the answer itself.
  (Trinity reads every truth like a reply, so the truth `\frac{1}{2}` would be the number 2.)
- The two are compared by services/explorer/math_equiv.py (`0.5` = `\frac{1}{2}`; Qwen2.5-Math
  also accepts a number off by a factor of 100, as a percentage; this does not).
"""

from __future__ import annotations

import re
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.answers import balanced_braces, last_boxed
from services.explorer.math_equiv import equivalent
from services.explorer.workflows.base import Task, Workflow

SYSTEM_PROMPT = "You are a helpful assistant."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
EVAL_SAMPLING: dict[str, Any] = {"n": 1, "temperature": 0.6, "top_p": 0.8}

_ANSWER_IS = (
    re.compile(r"(?:final|the)\s+answer\s+is\s*:?\s*(.+)", re.IGNORECASE),
    re.compile(r"答案是\s*:?\s*(.+)"),
)
_NUMBER = re.compile(r"[-+]?\d*\.?\d+")


def reply_answer(text: str) -> str | None:
    """The final answer of a reply (see the module docstring), or None."""
    if "boxed" in text:
        tail = text.split("boxed")[-1]
        closed = balanced_braces(tail, 0) if tail.startswith("{") else None
        if closed is not None:
            return closed.strip() or None  # an empty box is no answer, as in Qwen2.5-Math
        loose = re.search(r"\{?([^$}]+)\}?", tail)
        if loose:
            return loose.group(1).strip() or None
    for pattern in _ANSWER_IS:
        said = pattern.search(text)
        if said:
            return said.group(1).strip().rstrip(".") or None
    numbers = _NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else None


def truth_answer(truth: str) -> str | None:
    """The final answer a truth column states (see the module docstring), or None."""
    boxed = last_boxed(truth)
    if boxed is not None:
        return boxed
    if "####" in truth:
        return truth.rsplit("####", 1)[1].strip() or None
    stripped = truth.strip()
    if "\n" in stripped:
        return reply_answer(stripped)
    return stripped or None


def eval_accuracy(response: str, truth: str) -> float:
    """1.0 when the reply's final answer is mathematically the truth's, else 0.0."""
    return 1.0 if equivalent(reply_answer(response), truth_answer(truth)) else 0.0


class MathEvalWorkflow(Workflow):
    """`math_eval_workflow`: see the module docstring. Neither repeatable nor resettable, as in Trinity."""

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.truth = task.truth

    def format_messages(self) -> list[dict[str, str]]:
        raw = self.task.raw_task
        question = raw.get("question", raw.get(self.task.format_args.prompt_key))
        if question is None:
            raise InvalidArgument(
                f"task {self.task.task_id!r} has no 'question' column, which math_eval_workflow reads",
                field="raw_task.question",
            )
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{question}\n{INSTRUCTION}"},
        ]

    def score(self, exps: list[Experience]) -> list[Experience]:
        if self.truth is None:
            return exps
        for exp in exps:
            accuracy = eval_accuracy(exp.response_text, self.truth)
            exp.metrics["accuracy"] = accuracy
            exp.reward = accuracy
            exp.info["truth"] = self.truth
        return exps

    def run(self) -> list[Experience]:
        return self.score(self.model.chat(self.format_messages(), **EVAL_SAMPLING))


class AsyncMathEvalWorkflow(MathEvalWorkflow):
    """`async_math_eval_workflow`: MathEvalWorkflow on the event loop."""

    is_async = True

    async def run_async(self) -> list[Experience]:
        return self.score(await self.model.chat_async(self.format_messages(), **EVAL_SAMPLING))
