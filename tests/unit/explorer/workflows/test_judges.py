"""Judge workflows: prompts, reading judge replies, fallbacks, rewards derived by hand.

The judge here is a fake OpenAI client (tests/integration/test_judge_workflow.py has the real one);
the policy is a canned model. Covers math_ruler (sync and async), the trainable RULER and the rubric
judges; test_workflow_math_rm_eval.py has math_rm, rm_gallery_reward and math_eval.
"""

from __future__ import annotations

import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import InvalidArgument
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.workflows import WORKFLOWS
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
from tests.fakes.judges import FakeJudge, ScriptedModel, make_task

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
