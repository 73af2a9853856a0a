r"""`math_eval_workflow` / `async_math_eval_workflow`: Trinity-RFT's MathEvalWorkflow (Qwen2.5-Math style).

Each run asks the model once (n 1, temperature 0.6, top_p 0.8, whatever the taskset's rollout_args
say, as in Trinity) with Qwen2.5-Math's `qwen_boxed` prompt: system "You are a helpful assistant.",
user "<question>\nPlease reason step by step, and put your final answer within \boxed{}." The
question is the task's `question` column (Trinity reads that column whatever format.prompt_key
says; here a task without it falls back to format.prompt_key's column). The runner calls run()
repeat_times times, so an eval taskset's k samples are k runs.

The metric is `accuracy`, 1 when the reply's final answer states the truth's, else 0; the reward is
the same number (Trinity leaves the reward unset). No truth: no accuracy, reward unset. Answers are
read and compared by the one answer reader, services/explorer/rewards/answers.py:
- the reply's answer is its `final_answer`, in Qwen2.5-Math's order: the last box, else the rest of
  the line after "the answer is" / "final answer is" / "答案是", else the last number (where
  Qwen2.5-Math reads what follows an unclosed box up to `}` or `$`, the reader finds no box there);
- the truth's answer is its `truth_answer`: its box, else what follows its last `####` (GSM8K),
  else a worked solution (several lines) read like a reply, and a one-line truth is the answer
  itself (Trinity reads every truth like a reply, so the truth `\frac{1}{2}` would be the number 2);
- the two are compared by `same_answer` (`0.5` = `\frac{1}{2}`; Qwen2.5-Math also accepts a number
  off by a factor of 100, as a percentage; this does not).
"""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.rewards.answers import final_answer, same_answer, truth_answer
from services.explorer.workflows.base import Task, Workflow

SYSTEM_PROMPT = "You are a helpful assistant."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
EVAL_SAMPLING: dict[str, Any] = {"n": 1, "temperature": 0.6, "top_p": 0.8}


def eval_accuracy(response: str, truth: str) -> float:
    """1.0 when the reply's final answer is mathematically the truth's, else 0.0."""
    return 1.0 if same_answer(final_answer(response), truth_answer(truth)) else 0.0


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
