"""`trajectory_accuracy_grader_reward` (alias `openjudge_reward`): an LLM judge grades the whole chat.

Trinity-RFT v0.6's TrajectoryAccuracyGrader reward, under its arguments, against OpenJudge's
interface (https://github.com/modelscope/OpenJudge, `pip install py-openjudge`, import name
`openjudge`): OpenJudge's `TrajectoryAccuracyGrader` with an `OpenAIChatModel` judge (`model_name`,
or `judge_model_name`; temperature 0.0) at the base URL held by the env variable
`judge_api_base_url_env` (default OPENAI_BASE_URL; it must be set) with the key in
`judge_api_key_env` (default OPENAI_API_KEY; may be empty), run by a `GradingRunner`
(`max_concurrency` 8).

It is called the way `math_rm_workflow` calls a reward, `reward(experience, messages, ...)`: the
reply is appended to the prompt's messages as the assistant's turn (unless the last message already
is one) and the judge grades `{"messages": [...]}`. Parts: `trajectory_score`, the judge's score
(0 when the grader returned an error), and `reward`, that score mapped linearly from
[score_min, score_max] (default [1, 3]) onto [0, 1] and clipped, or the raw score when
`normalize_score` is false or score_max <= score_min; the workflow takes `reward` as the reward.

OpenJudge is imported when the reward is built; `trinity config check` and the explorer's start
name what is missing (the package, the base-URL variable) through `preflight`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from services.common.errors import FailedPrecondition
from services.explorer.extras import import_extra, installed

_INSTALL = "pip install py-openjudge"


def _openjudge(module: str) -> Any:
    return import_extra("openjudge", module, install=_INSTALL, needed_by="trajectory_accuracy_grader_reward")


class TrajectoryAccuracyGraderReward:
    """See the module docstring."""

    requires = (("openjudge", _INSTALL),)

    @classmethod
    def preflight(cls, reward_fn_args: dict[str, Any]) -> list[str]:
        """What stops the reward before its first reply: the package, the judge's base URL."""
        problems = []
        if not installed("openjudge"):
            problems.append(
                f"trajectory_accuracy_grader_reward needs the Python package 'openjudge' ({_INSTALL})"
            )
        env = reward_fn_args.get("judge_api_base_url_env", "OPENAI_BASE_URL")
        if not os.environ.get(env):
            problems.append(
                f"trajectory_accuracy_grader_reward's judge base URL is read from the environment variable"
                f" {env} (reward_fn_args.judge_api_base_url_env), which is not set: export it (the judge's"
                " OpenAI-compatible endpoint, e.g. http://host:8000/v1)"
            )
        return problems

    def __init__(
        self,
        reward_name: str = "openjudge_trajectory_accuracy_reward",
        model_name: str = "qwen3-max",
        normalize_score: bool = True,
        score_min: float = 1.0,
        score_max: float = 3.0,
        judge_api_base_url_env: str = "OPENAI_BASE_URL",
        judge_api_key_env: str = "OPENAI_API_KEY",
        judge_model_name: str | None = None,
        temperature: float = 0.0,
        max_concurrency: int = 8,
    ) -> None:
        grader_cls = _openjudge("graders.agent.trajectory.trajectory_accuracy").TrajectoryAccuracyGrader
        model_cls = _openjudge("models.openai_chat_model").OpenAIChatModel
        runner_cls = _openjudge("runner.grading_runner").GradingRunner
        base_url = os.environ.get(judge_api_base_url_env, "")
        if not base_url:
            raise FailedPrecondition(
                f"the judge's base URL is missing: set the environment variable {judge_api_base_url_env}",
                field="reward_fn_args.judge_api_base_url_env",
            )
        judge = model_cls(
            model=judge_model_name or model_name,
            base_url=base_url,
            api_key=os.environ.get(judge_api_key_env, ""),
            temperature=temperature,
        )
        self.runner = runner_cls(
            grader_configs={"trajectory": grader_cls(model=judge)},
            max_concurrency=max_concurrency,
            show_progress=False,
        )
        self.reward_name = reward_name
        self.normalize_score = normalize_score
        self.score_min, self.score_max = float(score_min), float(score_max)

    def __call__(self, experience: Any, messages: list[dict[str, Any]], **_: Any) -> dict[str, float]:
        chat = list(messages)
        if not chat or chat[-1].get("role") != "assistant":
            chat.append({"role": "assistant", "content": str(getattr(experience, "response_text", "") or "")})
        results = asyncio.run(self.runner.arun([{"messages": chat}]))
        return self.parts(results)

    def parts(self, results: dict[str, Any]) -> dict[str, float]:
        """{`<grader>_score`: its first result's score (0 for a GraderError; other results are
        skipped), `reward`: their mean (0 when none), normalized}."""
        schema = _openjudge("graders.schema")
        parts: dict[str, float] = {}
        for name, graded in results.items():
            first = graded[0] if graded else None
            if isinstance(first, schema.GraderScore):
                parts[f"{name}_score"] = float(first.score)
            elif isinstance(first, schema.GraderError):
                parts[f"{name}_score"] = 0.0
        raw = sum(parts.values()) / len(parts) if parts else 0.0
        if self.normalize_score and self.score_max > self.score_min:
            raw = min(1.0, max(0.0, (raw - self.score_min) / (self.score_max - self.score_min)))
        return {**parts, "reward": raw}
