"""trajectory_accuracy_grader_reward against a stand-in with OpenJudge's interface (OpenJudge itself
is not installed here: `preflight` names it, and building the reward without it is refused)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from services.common.errors import FailedPrecondition
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.rewards.openjudge import TrajectoryAccuracyGraderReward


@dataclass
class GraderScore:
    score: float


@dataclass
class GraderError:
    error: str


class FakeRunner:
    """GradingRunner(grader_configs, max_concurrency, show_progress).arun([data]) -> {grader: [result]}."""

    result: Any = GraderScore(2.5)
    seen: list[Any] = []

    def __init__(self, *, grader_configs: dict[str, Any], max_concurrency: int, show_progress: bool) -> None:
        self.graders, self.max_concurrency = grader_configs, max_concurrency

    async def arun(self, data: list[dict[str, Any]]) -> dict[str, list[Any]]:
        FakeRunner.seen.append((self.graders, data))
        return {name: [FakeRunner.result] for name in self.graders}


@pytest.fixture
def openjudge(monkeypatch: pytest.MonkeyPatch) -> None:
    def module(name: str, **attrs: Any) -> None:
        fake = types.ModuleType(name)
        fake.__spec__ = importlib.machinery.ModuleSpec(name, None)
        fake.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, fake)

    module("openjudge")
    module(
        "openjudge.graders.agent.trajectory.trajectory_accuracy",
        TrajectoryAccuracyGrader=lambda model: ("grader", model),
    )
    module("openjudge.models.openai_chat_model", OpenAIChatModel=lambda **kw: kw)
    module("openjudge.runner.grading_runner", GradingRunner=FakeRunner)
    module("openjudge.graders.schema", GraderScore=GraderScore, GraderError=GraderError)
    monkeypatch.setenv("JUDGE_URL", "http://judge:8000/v1")
    monkeypatch.setenv("JUDGE_KEY", "k")
    FakeRunner.seen = []


def make(**args: Any) -> Any:
    return REWARD_FUNCTIONS.get("trajectory_accuracy_grader_reward")(
        judge_api_base_url_env="JUDGE_URL", judge_api_key_env="JUDGE_KEY", **args
    )


@pytest.mark.usefixtures("openjudge")
def test_the_judge_grades_the_chat_with_the_reply_and_the_score_is_normalized() -> None:
    reward = make(model_name="judge-m")
    messages = [{"role": "user", "content": "1+1?"}]
    parts = reward(SimpleNamespace(response_text="2"), messages, ground_truth="2")
    # raw 2.5 on [1, 3]: (2.5 - 1) / (3 - 1) = 0.75
    assert parts == {"trajectory_score": 2.5, "reward": 0.75}
    graders, data = FakeRunner.seen[0]
    assert data == [{"messages": [*messages, {"role": "assistant", "content": "2"}]}]
    _, judge = graders["trajectory"]
    assert judge == {
        "model": "judge-m",
        "base_url": "http://judge:8000/v1",
        "api_key": "k",
        "temperature": 0.0,
    }
    assert messages == [{"role": "user", "content": "1+1?"}]  # the caller's list is left alone


@pytest.mark.usefixtures("openjudge")
def test_scores_are_clipped_errors_score_zero_and_normalization_can_be_off() -> None:
    FakeRunner.result = GraderScore(4.0)  # (4 - 1) / 2 = 1.5 -> clipped to 1
    assert make()(SimpleNamespace(response_text="x"), [])["reward"] == 1.0
    FakeRunner.result = GraderError("judge down")  # 0 -> (0 - 1) / 2 < 0 -> clipped to 0
    assert make()(SimpleNamespace(response_text="x"), []) == {"trajectory_score": 0.0, "reward": 0.0}
    FakeRunner.result = GraderScore(2.0)
    assert make(normalize_score=False)(SimpleNamespace(response_text="x"), [])["reward"] == 2.0
    assert make(score_min=3.0, score_max=1.0)(SimpleNamespace(response_text="x"), [])["reward"] == 2.0
    # an assistant turn already last is graded as it is
    make()(SimpleNamespace(response_text="ignored"), [{"role": "assistant", "content": "a"}])
    assert FakeRunner.seen[-1][1] == [{"messages": [{"role": "assistant", "content": "a"}]}]
    FakeRunner.result = GraderScore(2.5)


def test_without_openjudge_or_the_url_the_reward_is_refused_naming_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NO_SUCH_URL_VAR", raising=False)
    problems = TrajectoryAccuracyGraderReward.preflight({"judge_api_base_url_env": "NO_SUCH_URL_VAR"})
    assert any("pip install py-openjudge" in p for p in problems)
    assert any("NO_SUCH_URL_VAR" in p and "not set" in p for p in problems)
    with pytest.raises(FailedPrecondition, match="py-openjudge"):
        TrajectoryAccuracyGraderReward()


@pytest.mark.usefixtures("openjudge")
def test_a_missing_url_is_refused_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUDGE_URL")
    assert TrajectoryAccuracyGraderReward.preflight({"judge_api_base_url_env": "JUDGE_URL"}) != []
    with pytest.raises(FailedPrecondition, match="JUDGE_URL"):
        make()


@pytest.mark.usefixtures("openjudge")
def test_math_rm_workflow_takes_the_reward_part_not_the_sum() -> None:
    # Trinity's math_openjudge_workflow rule: reward 0.75 (normalized), not 2.5 + 0.75
    from services.common.config.buffer import FormatConfig
    from tests.fakes.judges import ScriptedModel, make_task

    fmt = FormatConfig(prompt_key="question", response_key="answer")
    args = {"judge_api_base_url_env": "JUDGE_URL", "judge_api_key_env": "JUDGE_KEY"}
    task = make_task(
        "math_rm_workflow", reward_fn=TrajectoryAccuracyGraderReward, reward_fn_args=args, format_args=fmt
    )
    exps = task.to_workflow(ScriptedModel(["4"])).run()
    assert exps[0].reward == 0.75 and exps[0].metrics["trajectory_score"] == 2.5
