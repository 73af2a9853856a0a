"""Rubric-as-reward: Trinity-RFT's `rubric_judge_workflow` and `rubric_judge_openai_workflow`.

After RaR-Implicit (arXiv:2507.17746): an LLM judge reads the question, one answer and the task's
rubric (its `rubric` column: a list of {"description", "weight"} items) and rates the answer 1 to
10 in a fenced JSON block; the reward is rating / 10, or 0 when the reply cannot be read.
`judge_success` (on every answer of the task) is the share of readable replies. The judge is
asked once per answer, at temperature 0.

- `rubric_judge_workflow`: the judge is the first of explorer.auxiliary_models.
- `rubric_judge_openai_workflow`: the judge is an external OpenAI-compatible API; workflow_args
  (Trinity's names and defaults): `judge_model_name` (required), `judge_api_base_url_env`
  ("OPENAI_BASE_URL") and `judge_api_key_env` ("OPENAI_API_KEY"), the environment variables that
  hold the endpoint and its key.

The policy's system prompt is format.system_prompt, else judging.RUBRIC_POLICY_SYSTEM_PROMPT.
"""

from __future__ import annotations

import os
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.workflows.base import Task
from services.explorer.workflows.judging import (
    RUBRIC_POLICY_SYSTEM_PROMPT,
    ask_judge,
    first_auxiliary_model,
    format_rubric,
    parse_rubric_rating,
    rubric_messages,
)
from services.explorer.workflows.math import SimpleWorkflow

log = get_logger("explorer.judges")


class RubricJudgeWorkflow(SimpleWorkflow):
    """`rubric_judge_workflow`: see the module docstring."""

    name = "rubric_judge_workflow"

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.judge = self.build_judge()

    def build_judge(self) -> Any:
        """The judge's OpenAI client (a subclass may supply another)."""
        return first_auxiliary_model(self.name, self.auxiliary_models)

    def reset(self, task: Task) -> None:
        self.task, self.format_args, self.rollout_args = task, task.format_args, task.rollout_args
        self.question, self.truth = task.task_desc, task.truth
        if self.question is None:
            raise KeyError(
                f"task {task.task_id!r} has no {task.format_args.prompt_key!r} column (format.prompt_key)"
            )
        configured = task.format_args.system_prompt
        self.system_prompt = RUBRIC_POLICY_SYSTEM_PROMPT if configured is None else configured
        self.rubric_text = format_rubric(task.raw_task.get("rubric"))

    def format_messages(self) -> list[dict[str, str]]:
        system = self.task.raw_task.get(self.format_args.system_prompt_key or "") or self.system_prompt
        messages = [{"role": "system", "content": str(system)}] if system else []
        messages.append({"role": "user", "content": str(self.question)})
        return messages

    def judge_answer(self, answer: str) -> float | None:
        """The rubric reward of one answer, None when the judge's reply cannot be read."""
        reply = ask_judge(
            self.judge, rubric_messages(str(self.question), answer, self.rubric_text), temperature=0.0
        )
        rating = parse_rubric_rating(reply)
        if rating is None:
            log.warning(
                "judge_reply_unreadable",
                workflow=self.name,
                task_id=self.task.task_id,
                reply=(reply or "")[:200],
            )
        return rating

    def run(self) -> list[Experience]:
        exps = self.model.chat(self.format_messages(), **self.rollout_args.sampling())
        ratings = [self.judge_answer(exp.response_text) for exp in exps]
        success = sum(r is not None for r in ratings) / len(ratings) if ratings else 0.0
        for exp, rating in zip(exps, ratings, strict=True):
            exp.reward = 0.0 if rating is None else rating
            exp.metrics["judge_success"] = success
            exp.info["truth"] = self.truth
        return exps


class RubricJudgeWorkflowWithAPI(RubricJudgeWorkflow):
    """`rubric_judge_openai_workflow`: RubricJudgeWorkflow judged by an external OpenAI-compatible API."""

    name = "rubric_judge_openai_workflow"

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        problems = super().preflight(workflow_args)
        if not workflow_args.get("judge_model_name"):
            problems.append(
                "rubric_judge_openai_workflow needs workflow_args.judge_model_name, the judge model's "
                "name at the API"
            )
        return problems

    def build_judge(self) -> Any:
        args = self.task.workflow_args
        model_name = args.get("judge_model_name")
        if not model_name:
            raise InvalidArgument(
                "rubric_judge_openai_workflow needs the judge model's name at the API",
                field="workflow_args.judge_model_name",
            )
        base_url_env = str(args.get("judge_api_base_url_env", "OPENAI_BASE_URL"))
        api_key_env = str(args.get("judge_api_key_env", "OPENAI_API_KEY"))
        base_url = os.getenv(base_url_env, "")
        if not base_url:
            raise InvalidArgument(
                f"the judge API's base URL is missing: set the environment variable {base_url_env} "
                "(workflow_args.judge_api_base_url_env names the variable)",
                field="workflow_args.judge_api_base_url_env",
            )
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=os.getenv(api_key_env, ""))
        client.model_path = model_name  # type: ignore[attr-defined]  # what ask_judge names as the model
        return client
