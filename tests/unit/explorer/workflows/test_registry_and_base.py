"""Rewards, the registry (dotted paths, plugin dirs), a Trinity workflow ported by imports, multi-turn masks."""

from __future__ import annotations

import json
import textwrap
from typing import List  # noqa: UP035 - the Trinity example as published

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.explorer.plugins import load_plugins
from services.explorer.rewards import REWARD_FUNCTIONS
from services.explorer.rewards.answers import final_answer
from services.explorer.rewards.countdown import countdown_reward
from services.explorer.rewards.math import math_reward
from services.explorer.runner import VersionRef, WorkflowRunner
from services.explorer.workflows import WORKFLOWS, Experience, Task, Workflow
from services.explorer.workflows.base import RolloutArgs
from services.explorer.workflows.multi_turn import StepWiseEnvWorkflow


@pytest.mark.parametrize(
    ("response", "truth", "reward"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("first 3 then 42", "42", 1.0),
        ("the total is 1,234.", "1234", 1.0),
        ("\\boxed{x+1}", "\\boxed{x + 1}", 1.0),
        ("I think 41", "42", 0.0),
        ("no number here", "7", 0.0),
    ],
)
def test_math_reward(response, truth, reward):
    assert math_reward(response, truth)["accuracy"] == reward


def test_extract_answer_prefers_boxed_with_nested_braces():
    assert final_answer("1, 2, \\boxed{\\sqrt{4}} then 9") == "\\sqrt{4}"


def test_countdown_reward():
    truth = json.dumps({"numbers": [3, 5, 7], "target": 22})
    assert countdown_reward("<answer>3 * 5 + 7</answer>", truth) == {"accuracy": 1.0, "format": 0.0}
    assert countdown_reward("<answer>(3 + 5) * 7</answer>", truth)["format"] == 0.1  # 56: well-formed, wrong
    assert countdown_reward("<answer>3 * 5 + 7 + 3</answer>", truth)["accuracy"] == 0.0  # 3 used twice
    assert countdown_reward("<answer>__import__('os')</answer>", truth)["accuracy"] == 0.0
    assert countdown_reward("3 * 5 + 7", truth) == {"accuracy": 0.0, "format": 0.0}


def test_registry_names_dotted_paths_and_plugins(tmp_path):
    assert REWARD_FUNCTIONS.get("arith_reward")(response=" 0 432", truth="0432") == {"accuracy": 1.0}
    assert REWARD_FUNCTIONS.get("services.explorer.rewards.math.math_reward") is math_reward
    with pytest.raises(InvalidArgument, match="unknown workflow 'nope'.*math_workflow") as info:
        WORKFLOWS.get("nope", field="default_workflow_type")
    assert info.value.field == "default_workflow_type"
    (tmp_path / "my_plugin.py").write_text(
        textwrap.dedent("""
        from services.explorer.rewards import REWARD_FUNCTIONS

        @REWARD_FUNCTIONS.register_module("always_half")
        def always_half(response, truth=None, **kw):
            return 0.5
    """)
    )
    assert load_plugins([str(tmp_path)]) == ["trinity_plugin_my_plugin"]
    assert REWARD_FUNCTIONS.get("always_half")(response="x") == 0.5
    with pytest.raises(InvalidArgument, match="already registered"):
        REWARD_FUNCTIONS.register_module("always_half", lambda **kw: 1.0)
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_plugins([str(tmp_path / "missing")])


# --- Trinity's documented example workflow, with only the imports changed --------------------------


@WORKFLOWS.register_module("example_workflow")
class ExampleWorkflow(Workflow):
    def __init__(self, task: Task, model, auxiliary_models: List):  # noqa: UP006
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.question = task.raw_task.get("question")
        self.answer = task.raw_task.get("answer")
        self.rollout_args = task.rollout_args

    def calculate_reward(self, response: str, truth: str) -> float:
        if response == truth:
            return 1.0
        else:
            return 0.0

    def run(self) -> List[Experience]:  # noqa: UP006
        responses = self.model.chat(
            [{"role": "user", "content": f"Question:\n{self.question}"}],
            n=self.rollout_args.n,
            temperature=self.rollout_args.temperature,
        )
        experiences = []
        for response in responses:
            reward: float = self.calculate_reward(response.response_text, self.answer)
            experiences.append(
                Experience(
                    tokens=response.tokens,
                    prompt_length=response.prompt_length,
                    reward=reward,
                    logprobs=response.logprobs,
                )
            )
        return experiences

    def resettable(self):
        return True

    def reset(self, task: Task):
        self.question = task.raw_task.get("question")
        self.answer = task.raw_task.get("answer")


async def test_trinity_example_workflow_runs_unchanged():
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
            lambda i: ModelWrapper(engine, tok, max_response_tokens=5),
            slots=2,
            max_timeout=30,
            max_retry_times=0,
            version_fn=VersionRef(7),
        )
        cls = WORKFLOWS.get("example_workflow")
        tasks = [
            Task(
                workflow=cls,
                raw_task={"question": "1+1=", "answer": "2"},
                task_id=str(i),
                repeat_times=3,
                rollout_args=RolloutArgs(temperature=1.0),
            )
            for i in range(2)
        ]
        results = await runner.run_tasks(tasks)
        for result in results:
            exps = [e for r in results if r.task is result.task for e in r.experiences]
            assert not result.skipped and len(exps) == 3 and sorted(e.run_id for e in exps) == [0, 1, 2]
            for e in exps:
                assert e.model_version == 7 and e.tokens.dtype == np.int64 and e.reward in (0.0, 1.0)
                assert tok.decode(e.tokens[: e.prompt_length].tolist()) == "Question:\n1+1="
    finally:
        engine.close()


# --- multi-turn ------------------------------------------------------------------------------------


class ScriptedModel:
    """Chars as tokens; answers with the scripted guesses; logprobs -0.5 per token."""

    max_prompt_tokens = 1000
    model_version = 0

    def __init__(self, guesses):
        self.guesses = list(guesses)
        self.prompts = []

    def tokenize(self, text):
        return [ord(c) for c in text]

    def render_chat(self, messages):
        return "".join(m["content"] for m in messages)

    async def generate_tokens_async(self, ids, **kwargs):
        self.prompts.append(list(ids))
        action = self.guesses.pop(0)
        resp = [ord(c) for c in action]
        return [
            Experience(
                tokens=np.array(ids + resp),
                prompt_length=len(ids),
                model_version=0,
                logprobs=np.full(len(resp), -0.5, np.float32),
                response_text=action,
            )
        ]


async def test_multi_turn_masks_environment_tokens():
    task = Task(
        workflow=StepWiseEnvWorkflow,
        raw_task={"target": 25, "low": 0, "high": 99},
        workflow_args={"max_turns": 4, "observation_template": "|{observation}|"},
    )
    model = ScriptedModel(["50", "I say 25"])
    [traj] = await StepWiseEnvWorkflow(task=task, model=model).run_async()
    text = "".join(chr(t) for t in traj.tokens)
    assert text == "Guess a number between 0 and 99.\n" + "50" + "|Lower.|" + "I say 25"
    mask = traj.action_mask.tolist()
    assert mask == [True] * 2 + [False] * len("|Lower.|") + [True] * len("I say 25")
    assert traj.logprobs.tolist() == [-0.5] * 2 + [0.0] * len("|Lower.|") + [-0.5] * len("I say 25")
    assert traj.reward == 1.0 and traj.metrics == {"turns": 2.0, "accuracy": 1.0}
    traj.validate()
    # the second turn's prompt is the first turn's tokens, not a re-tokenized rendering
    assert model.prompts[1] == traj.tokens[: len(model.prompts[1])].tolist()


async def test_step_wise_mode_emits_one_experience_per_turn_with_the_return():
    task = Task(
        workflow=StepWiseEnvWorkflow,
        raw_task={"target": 3},
        workflow_args={"max_turns": 2, "step_wise": True},
    )
    turns = await StepWiseEnvWorkflow(task=task, model=ScriptedModel(["hmm", "7"])).run_async()
    assert [t.response_text for t in turns] == ["hmm", "7"]
    assert [t.reward for t in turns] == [0.0, 0.0] and turns[1].metrics["turns"] == 2.0
