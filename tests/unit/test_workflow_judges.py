"""Judge and reward-model workflows: prompts, reading judge replies, fallbacks, rewards derived by hand.

The judge here is a fake OpenAI client (tests/integration/test_judge_workflow.py has the real one);
the policy is a canned model. Covers math_eval, math_rm, math_ruler (sync and async), the trainable
RULER, the rubric judges and rm_gallery_reward (over a stand-in of the RM-Gallery package).
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.experience import Experience
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.rm_gallery_reward import RMGalleryReward
from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.base import RolloutArgs
from services.explorer.workflows.judges import grade_ruler_replies
from services.explorer.workflows.judging import (
    NO_RUBRIC,
    RUBRIC_JUDGE_SYSTEM_PROMPT,
    RUBRIC_POLICY_SYSTEM_PROMPT,
    THINK_ANSWER_SYSTEM_PROMPT,
    format_rubric,
    parse_rubric_rating,
    parse_score_list,
    rubric_messages,
    ruler_messages,
)
from services.explorer.workflows.math_eval import eval_accuracy, reply_answer, truth_answer

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


# --- RULER: the prompt and reading the scores ----------------------------------------------------


def test_ruler_prompt_text() -> None:
    fmt = (
        "Solution format requirement: first thinks about the reasoning process in the mind and then "
        "provides the final answer. The reasoning process and answer are enclosed within <think> </think> "
        "and <answer> </answer> tags, respectively, i.e.,\n<think> reasoning process here </think>\n"
        "<answer> answer here </answer>."
    )
    ask = (
        "Please assign a score within the range [0, 1] for each of them, reflecting how well they solve "
        "the question.\nYou may compare them against each other and think step by step before returning "
        "your final scores, but keep your reasoning process brief and concise when possible."
    )
    end = "Conclude your response with a list of scores, in the following format: [score for solution 1, score for solution 2, ..., score for solution 2]\n"
    system, user = ruler_messages("Q?", ["A", "B"])
    assert system == {
        "role": "system",
        "content": "You are a fair judge. The user will provide a question and 2 candidate solutions to it. "
        "Your task is to compare the solutions, see how well they resolve the question, and assign a "
        "score within the range [0, 1] for each solution.",
    }
    solutions = "Candidate solution 1: A\n\nCandidate solution 2: B"
    assert user["content"] == (
        f"\nBelow is a question and several candidate solutions.\n\nQuestion: Q?\n\n{fmt}\n\n"
        f"{solutions}\n\n{ask}\n\n{end}"
    )
    compact = ruler_messages("Q?", ["A", "B"], spaced=False)[1]["content"]
    assert compact == (
        f"\nBelow is a question and several candidate solutions.\nQuestion: Q?\n\n{fmt}\n{solutions}\n{ask}\n{end}"
    )


@pytest.mark.parametrize(
    ("reply", "scores"),
    [
        ("Solution 1 is right [not a list]. Final: [0.5, 1.2, -1]", [0.5, 1.0, 0.0]),  # clipped
        ("[1, 0, 0.25]", [1.0, 0.0, 0.25]),
        ("[0.5, 0.5]", None),  # two scores for three answers
        ("[0.1, 0.2, 0.3, 0.4]", None),
        ("no list here", None),
        ("] then [", None),
        ("[a, b, c]", None),
        ("[True, 0, 1]", None),
        ("[0.1, 0.2, (0.3)j]", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_score_list(reply: str | None, scores: list[float] | None) -> None:
    assert parse_score_list(reply, 3) == scores


def test_grade_ruler_replies_by_hand() -> None:
    # two readable replies of three: rate 2/3, scores averaged over the readable ones
    rate, means, rewards = grade_ruler_replies(["[0.2, 0.4]", "[0.6, 0.8]", "nope"], 2, None)
    assert rate == pytest.approx(2 / 3) and means == pytest.approx([0.4, 0.6]) and rewards == [0, 0, 0]
    # with targets [1, 0]: |0.2-1| + |0.4-0| = 1.2 -> 1 - 0.6 = 0.4; |0.6-1| + |0.8| = 1.2 -> 0.4
    _, _, rewards = grade_ruler_replies(["[0.2, 0.4]", "[1, 0]", "x"], 2, [1.0, 0.0])
    assert rewards == pytest.approx([0.4, 1.0, 0.0])
    assert grade_ruler_replies(["?"], 2, None) == (0.0, [0.0, 0.0], [0.0])


# --- math_ruler_workflow ----------------------------------------------------------------------


def test_math_ruler_rewards_are_the_judges_scores() -> None:
    replies = ["<think>2+2</think><answer>4</answer>", "<answer>5</answer>", "\\boxed{4}"]
    model, judge = ScriptedModel(replies), FakeJudge("Thinking... [0.9, 0.2, 1.5]")
    exps = make_task("math_ruler_workflow", n=3).to_workflow(model, [judge]).run()
    assert model.calls == [
        (
            [
                {"role": "system", "content": THINK_ANSWER_SYSTEM_PROMPT},
                {"role": "user", "content": "What is 2+2?"},
            ],
            {"n": 3, "temperature": 1.0},
        )
    ]
    assert judge.calls == [
        {"model": "judge-model", "messages": ruler_messages("What is 2+2?", replies), "stream": False}
    ]
    assert [e.reward for e in exps] == [0.9, 0.2, 1.0]
    # the gold reward (math_reward against the truth 4: accuracy + format_score +-0.1) is a metric only
    assert [e.metrics["accuracy"] for e in exps] == [1, 0, 1]
    assert [e.metrics["gold_reward"] for e in exps] == pytest.approx([1.1, -0.1, 0.9])
    assert all(e.metrics["judge_success"] == 1.0 for e in exps)


def test_math_ruler_unreadable_judge_reply_falls_back_to_zero() -> None:
    judge = FakeJudge("I cannot decide.")
    exps = make_task("math_ruler_workflow").to_workflow(ScriptedModel(["4", "5"]), [judge]).run()
    assert [e.reward for e in exps] == [0.0, 0.0]
    assert [e.metrics["judge_success"] for e in exps] == [0.0, 0.0]
    assert [e.metrics["accuracy"] for e in exps] == [1.0, 0.0]
    judge = FakeJudge(None)  # no content at all (e.g. a refusal)
    exps = make_task("math_ruler_workflow").to_workflow(ScriptedModel(["4", "5"]), [judge]).run()
    assert [e.metrics["judge_success"] for e in exps] == [0.0, 0.0]


def test_math_ruler_system_prompt_rules() -> None:
    model = ScriptedModel(["4"])
    fmt = FormatConfig(prompt_key="question", response_key="answer", system_prompt="Be brief.")
    make_task("math_ruler_workflow", format_args=fmt, n=1).to_workflow(model, [FakeJudge("[1]")]).run()
    assert model.calls[0][0][0] == {"role": "system", "content": "Be brief."}
    # another reward fn and no system prompt: no system message (Trinity sets it only for math_reward)
    model = ScriptedModel(["four", "4"])
    task = make_task("math_ruler_workflow", reward_fn=REWARD_FUNCTIONS.get("exact_match_reward"))
    exps = task.to_workflow(model, [FakeJudge("[1, 0]")]).run()
    assert model.calls[0][0] == [{"role": "user", "content": "What is 2+2?"}]
    assert [(e.metrics["accuracy"], e.reward) for e in exps] == [(0.0, 1.0), (1.0, 0.0)]


@pytest.mark.parametrize(
    "name", ["math_ruler_workflow", "async_math_ruler_workflow", "rubric_judge_workflow"]
)
def test_judge_workflows_need_an_auxiliary_model(name: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"{name} .*explorer.auxiliary_models") as info:
        make_task(name).to_workflow(ScriptedModel(["4"]), [])
    assert info.value.field == "explorer.auxiliary_models"


async def test_async_math_ruler_asks_the_judge_off_the_loop() -> None:
    judge = FakeJudge("[0.25, 0.75]")
    workflow = make_task("async_math_ruler_workflow").to_workflow(ScriptedModel(["4", "x"]), [judge])
    assert workflow.is_async
    exps = await workflow.run_async()
    assert [e.reward for e in exps] == [0.25, 0.75] and len(judge.calls) == 1


# --- math_trainable_ruler_workflow ------------------------------------------------------------


def test_trainable_ruler_with_truth_trains_the_judging_too() -> None:
    answers = ["\\boxed{4}", "\\boxed{5}"]  # gold rewards 1 - 0.1 and 0 - 0.1 (no <think> layout)
    judgements = ["[1.0, 0.0]", "I like both"]
    model = ScriptedModel(answers, judgements)
    workflow = make_task("math_trainable_ruler_workflow").to_workflow(model)
    workflow.ground_truth_probability = 1.0
    exps = workflow.run()
    assert len(model.calls) == 2
    judge_messages, judge_args = model.calls[1]
    assert judge_messages == ruler_messages("What is 2+2?", answers, spaced=False)
    assert judge_args == {"n": 2, "temperature": 1.0}  # as many judgements as answers
    assert len(exps) == 4
    assert [e.reward for e in exps[:2]] == pytest.approx([0.9, -0.1])  # the answers keep their gold rewards
    # targets (0.9 + 0.1) / 1.2 = 5/6 and (-0.1 + 0.1) / 1.2 = 0; [1, 0] is off by 1/6 and 0: 1 - 1/12
    assert exps[2].reward == pytest.approx(11 / 12) and exps[3].reward == 0.0
    assert [e.metrics["judge_success"] for e in exps] == [0.5] * 4
    assert exps[2].metrics["reward_for_judger"] == pytest.approx(11 / 12)
    assert [e.info.get("task_id_suffix") for e in exps] == [None, None, "-ruler", "-ruler"]


def test_trainable_ruler_without_truth_uses_the_judges_scores() -> None:
    model = ScriptedModel(["\\boxed{4}", "\\boxed{5}"], ["[0.3, 0.6]"])
    workflow = make_task("math_trainable_ruler_workflow").to_workflow(model)
    workflow.ground_truth_probability = 0.0
    exps = workflow.run()
    assert model.calls[1][1]["n"] == 1 and len(exps) == 2
    assert [e.reward for e in exps] == [0.3, 0.6]
    assert [e.metrics["gold_reward"] for e in exps] == pytest.approx([0.9, -0.1])
    unreadable = ScriptedModel(["a", "b"], ["??"])
    workflow = make_task("math_trainable_ruler_workflow").to_workflow(unreadable)
    workflow.ground_truth_probability = 0.0
    assert [(e.reward, e.metrics["judge_success"]) for e in workflow.run()] == [(0.0, 0.0), (0.0, 0.0)]


# --- rubric judges ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        ('```json\n{\n"rating": 7\n}```', 0.7),
        ('Here: ```\n{"rating": 10}\n``` done', 1.0),
        ('```json {"rating": 1} ``` and ```json {"rating": 9} ```', 0.1),  # the first block counts
        ('```json\n{"rating": 7.5}\n```', 0.75),
        ('```json\n{"rating": 0}\n```', None),
        ('```json\n{"rating": 11}\n```', None),
        ('```json\n{"rating": "7"}\n```', None),
        ('```json\n{"score": 7}\n```', None),
        ("```json\n[7]\n```", None),
        ('```json\n{"rating": 7\n', None),  # unclosed
        ('{"rating": 7}', None),  # no fence
        ("```json\n{rating: 7}\n```", None),
        (None, None),
    ],
)
def test_parse_rubric_rating(reply: str | None, reward: float | None) -> None:
    assert parse_rubric_rating(reply) == (None if reward is None else pytest.approx(reward))


def test_rubric_text_and_prompt() -> None:
    rubric = [{"description": "Names the drug", "weight": 5}, {"description": "Is brief", "weight": -1}]
    text = format_rubric(rubric)
    assert text == "Rubric 0 (weight: 5): Names the drug\nRubric 1 (weight: -1): Is brief"
    assert format_rubric('[{"description": "d", "weight": 1}]') == "Rubric 0 (weight: 1): d"
    assert format_rubric(None) == NO_RUBRIC and format_rubric([]) == NO_RUBRIC
    with pytest.raises(InvalidArgument, match="rubric"):
        format_rubric([{"description": "no weight"}])
    system, user = rubric_messages("Q?", "A.", text)
    assert system == {"role": "system", "content": RUBRIC_JUDGE_SYSTEM_PROMPT}
    assert user["content"] == (
        "Given the following prompt, response, and rubrics, please rate the overall quality of the "
        "response on a scale of 1 to 10 based\non how well it satisfies the rubrics.\n<prompt>\nQ?\n"
        f"</prompt>\n<response>\nA.\n</response>\n<rubrics>\n{text}\n</rubrics>\nYour JSON Evaluation:"
    )


def test_rubric_judge_rates_each_answer() -> None:
    raw = {"question": "Treat a cold?", "answer": "rest", "rubric": [{"description": "rest", "weight": 1}]}
    judge = FakeJudge('```json\n{"rating": 8}\n```', "a solid 9/10")
    model = ScriptedModel(["Rest.", "Antibiotics."])
    exps = make_task("rubric_judge_workflow", raw).to_workflow(model, [judge]).run()
    assert model.calls[0][0] == [
        {"role": "system", "content": RUBRIC_POLICY_SYSTEM_PROMPT},
        {"role": "user", "content": "Treat a cold?"},
    ]
    rubric = "Rubric 0 (weight: 1): rest"
    assert judge.calls == [
        {
            "model": "judge-model",
            "messages": rubric_messages("Treat a cold?", answer, rubric),
            "stream": False,
            "temperature": 0.0,
        }
        for answer in ("Rest.", "Antibiotics.")
    ]
    assert [e.reward for e in exps] == [pytest.approx(0.8), 0.0]  # the unreadable reply scores 0
    assert [e.metrics["judge_success"] for e in exps] == [0.5, 0.5]


def test_rubric_judge_with_api(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = WORKFLOWS.get("rubric_judge_openai_workflow")
    assert cls.preflight({}) and cls.preflight({"judge_model_name": "gpt-x"}) == []
    with pytest.raises(InvalidArgument, match="judge model's name") as info:
        make_task("rubric_judge_openai_workflow").to_workflow(ScriptedModel(["a"]))
    assert info.value.field == "workflow_args.judge_model_name"
    args = {
        "judge_model_name": "gpt-x",
        "judge_api_base_url_env": "JUDGE_URL",
        "judge_api_key_env": "JUDGE_KEY",
    }
    monkeypatch.delenv("JUDGE_URL", raising=False)
    with pytest.raises(InvalidArgument, match="JUDGE_URL"):
        make_task("rubric_judge_openai_workflow", workflow_args=args).to_workflow(ScriptedModel(["a"]))
    monkeypatch.setenv("JUDGE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("JUDGE_KEY", "secret")
    # no auxiliary model needed: the judge is the external API
    workflow = make_task("rubric_judge_openai_workflow", workflow_args=args).to_workflow(ScriptedModel(["a"]))
    assert str(workflow.judge.base_url) == "http://127.0.0.1:9/v1/"
    assert workflow.judge.api_key == "secret" and workflow.judge.model_path == "gpt-x"


# --- math_rm_workflow and rm_gallery_reward -----------------------------------------------------


class HalfAndQuarter:
    """A Trinity-style reward fn: constructed with reward_fn_args, called with (experience, messages)."""

    seen: list[tuple[str, list[dict[str, str]], Any]] = []

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, experience: Experience, messages: list[dict[str, str]], **kwargs: Any) -> dict:
        self.seen.append((experience.response_text, messages, kwargs))
        return {"a": 0.5 * self.scale, "b": 0.25 * self.scale}


@pytest.mark.parametrize("name", ["math_rm_workflow", "async_math_rm_workflow"])
async def test_math_rm_sums_the_reward_models_parts(name: str) -> None:
    HalfAndQuarter.seen.clear()
    fmt = FormatConfig(prompt_key="question", response_key="answer", system_prompt="S")
    task = make_task(name, reward_fn=HalfAndQuarter, reward_fn_args={"scale": 2.0}, format_args=fmt)
    workflow = task.to_workflow(ScriptedModel(["x", "y"]))
    exps = await workflow.run_async() if workflow.is_async else workflow.run()
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 2+2?"}]
    assert HalfAndQuarter.seen == [
        ("x", messages, {"ground_truth": "4"}),
        ("y", messages, {"ground_truth": "4"}),
    ]
    assert [e.reward for e in exps] == [1.5, 1.5] and exps[0].metrics == {"a": 1.0, "b": 0.5}


def test_math_rm_default_reward_needs_rm_gallery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rm_gallery", None)  # not importable, whether installed or not
    with pytest.raises(FailedPrecondition, match="pip install rm-gallery"):
        make_task("math_rm_workflow", reward_fn_args={"reward_name": "math_verify_reward"}).to_workflow(
            ScriptedModel(["x"])
        )


def _stand_in_rm_gallery(monkeypatch: pytest.MonkeyPatch) -> type:
    """Modules with RM-Gallery's names and shapes (rm_gallery 0.1.7); its one reward grades by the label."""

    def module(name: str, **attrs: Any) -> None:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)

    class Obj:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    class Step(Obj): ...

    class DataOutput(Obj): ...

    class DataSample(Obj): ...

    class ChatMessage(Obj): ...

    class WithScore(Obj): ...

    class WithRank(Obj):
        def __getitem__(self, i: int) -> WithScore:
            return WithScore(name=self.name, score=self.rank[i])

    class Grader:
        def __init__(self, mode: str) -> None:
            self.mode = mode

        def evaluate(self, sample: Any, **kwargs: Any) -> Any:
            answer = sample.output[0].answer
            right = float(answer.content == answer.label["reference"])
            details = {
                "score": [WithScore(name="accuracy", score=right), WithScore(name="format", score=0.1)],
                "rank": [WithRank(name="rank", rank=[0.7, 0.2])],
                "none": [],
            }[self.mode]
            answer.reward = Obj(score=right, details=details)
            Grader.last = (sample, kwargs)
            return sample

    class Registry:
        @classmethod
        def get(cls, name: str) -> Any:
            assert name == "grader", f"Reward module '{name}' not found"
            return Grader

    module("rm_gallery")
    module("rm_gallery.core.reward.registry", RewardRegistry=Registry)
    module("rm_gallery.core.data.schema", Step=Step, DataOutput=DataOutput, DataSample=DataSample)
    module("rm_gallery.core.model.message", ChatMessage=ChatMessage, MessageRole=str)
    module(
        "rm_gallery.core.reward.schema", RewardDimensionWithScore=WithScore, RewardDimensionWithRank=WithRank
    )
    return Grader


def test_rm_gallery_reward_builds_the_sample_and_reads_the_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    grader = _stand_in_rm_gallery(monkeypatch)
    exp = Experience(tokens=np.arange(4), prompt_length=2, model_version=0, response_text="4", info={"k": 1})
    messages = [{"role": "user", "content": "2+2?"}]
    reward = RMGalleryReward(reward_name="grader", mode="score")
    assert reward(exp, messages, ground_truth="4") == {"accuracy": 1.0, "format": 0.1}
    sample, kwargs = grader.last
    assert kwargs == {"ground_truth": "4"} and sample.metadata == {"k": 1}
    assert [(m.role, m.content) for m in sample.input] == [("user", "2+2?")]
    assert sample.output[0].answer.role == "assistant"
    assert RMGalleryReward(reward_name="grader", mode="rank")(exp, messages, ground_truth="5") == {
        "rank": 0.7
    }
    assert RMGalleryReward(reward_name="grader", mode="none")(exp, messages, ground_truth="5") == {
        "reward": 0.0
    }
    with pytest.raises(InvalidArgument, match="no reward named 'nope'"):
        RMGalleryReward(reward_name="nope")
    # through math_rm_workflow, as registered by name
    task = make_task(
        "math_rm_workflow",
        reward_fn=RMGalleryReward,
        reward_fn_args={"reward_name": "grader", "mode": "score"},
    )
    exps = task.to_workflow(ScriptedModel(["4", "5"])).run()
    assert [e.reward for e in exps] == [pytest.approx(1.1), pytest.approx(0.1)]


# --- math_eval_workflow -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} first, then \\boxed{12", "12"),  # an unclosed last box
        ("\\boxed{}", None),
        ("We get 3. The final answer is: 42.", "42"),
        ("所以答案是 7", "7"),
        ("we get 1,234 apples and 5.5 pears", "5.5"),
        ("no numbers", None),
    ],
)
def test_reply_answer(reply: str, answer: str | None) -> None:
    assert reply_answer(reply) == answer


def test_truth_answer_and_accuracy() -> None:
    assert truth_answer("She sold 48/2 = 24 clips.\nSo 48+24 = 72.\n#### 72") == "72"
    assert truth_answer("\\frac{1}{2}") == "\\frac{1}{2}"  # Trinity would read the number 2
    assert truth_answer("so it is \\boxed{3}") == "3"
    assert truth_answer("Add them.\nThe answer is 5.") == "5"
    assert eval_accuracy("thus \\boxed{0.5}", "\\frac{1}{2}") == 1.0
    assert eval_accuracy("thus \\boxed{2}", "\\frac{1}{2}") == 0.0
    assert eval_accuracy("The answer is 72", "blah\n#### 72") == 1.0


def test_math_eval_prompt_sampling_and_accuracy() -> None:
    model = ScriptedModel(["\\boxed{4}"])
    cls = WORKFLOWS.get("math_eval_workflow")
    assert not cls.can_repeat and not cls.can_reset
    exps = make_task("math_eval_workflow", n=5).to_workflow(model).run()
    assert model.calls == [
        (
            [
                {"role": "system", "content": "You are a helpful assistant."},
                {
                    "role": "user",
                    "content": "What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}.",
                },
            ],
            {"n": 1, "temperature": 0.6, "top_p": 0.8},  # Trinity's fixed eval sampling
        )
    ]
    assert exps[0].metrics == {"accuracy": 1.0} and exps[0].reward == 1.0
    no_truth = make_task("math_eval_workflow", {"question": "q"}).to_workflow(ScriptedModel(["4"])).run()
    assert no_truth[0].metrics == {} and no_truth[0].reward is None
    fmt = FormatConfig(prompt_key="problem", response_key="answer")
    other = ScriptedModel(["4"])
    make_task("math_eval_workflow", {"problem": "p?", "answer": "4"}, format_args=fmt).to_workflow(
        other
    ).run()
    assert other.calls[0][0][1]["content"].startswith("p?\n")
    with pytest.raises(InvalidArgument, match="'question'"):
        make_task("math_eval_workflow", {"answer": "4"}).to_workflow(ScriptedModel(["4"])).run()


async def test_async_math_eval_on_tiny_arith() -> None:
    """The runner drives async_math_eval_workflow on the builtin model: k runs of one sample each."""
    from services.explorer.engines.base import BatchingEngine
    from services.explorer.engines.transformers_engine import TransformersEngine
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer("builtin:tiny-arith")
    engine = BatchingEngine(
        TransformersEngine(
            load_causal_lm("builtin:tiny-arith"), eos_token_ids=[tok.eos_token_id], pad_token_id=0
        )
    )
    try:
        runner = WorkflowRunner(
            lambda i: ModelWrapper(engine, tok, max_response_tokens=8),
            slots=2,
            max_timeout=60,
            max_retry_times=0,
            version_fn=VersionRef(1),
        )
        task = make_task("async_math_eval_workflow", {"question": "3+4=", "answer": "7"}, repeat_times=3)
        results = await runner.run_tasks([task])  # not repeatable: one unit per repeat
        assert [len(r.experiences) for r in results] == [1, 1, 1] and not any(r.skipped for r in results)
        for exp in (r.experiences[0] for r in results):
            prompt = tok.decode(exp.tokens[: exp.prompt_length].tolist())
            # the tiny model's chat template concatenates the contents
            assert (
                prompt
                == "You are a helpful assistant.3+4=\nPlease reason step by step, and put your final answer within \\boxed{}."
            )
            assert exp.metrics["accuracy"] == eval_accuracy(exp.response_text, "7") == exp.reward
            assert exp.response_length <= 8 and exp.model_version == 1
    finally:
        engine.close()
