"""math_rm_workflow, rm_gallery_reward (over a stand-in of the RM-Gallery package) and math_eval_workflow:
rewards and answers derived by hand, one async math_eval run on tiny-arith.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.experience import Experience
from services.explorer.rewards.answers import final_answer, truth_answer
from services.explorer.rewards.rm_gallery import RMGalleryReward
from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import WORKFLOWS
from services.explorer.workflows.math_eval import eval_accuracy
from tests.fakes.judges import ScriptedModel, make_task

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
    assert final_answer(reply) == answer


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
    engine.engine.model_version = 1  # holds version 1, as after the explorer loaded it
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
