"""ALFWorld workflows (plain, step-wise, RAFT, RAFT-reflect).

Preflight names the missing package and data; parsing and rewards give hand-worked values from
Trinity-RFT's rules; episodes run against a stand-in environment with the real package's interface
(injected through `make_env`) on the real ModelWrapper over a scripted engine. `trinity config check`
reports what alfworld_workflow lacks.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.cli.config_check import check_file
from services.common.errors import InvalidArgument
from services.explorer.runner import normalize_experience
from services.explorer.workflows import RolloutArgs
from services.explorer.workflows.alfworld import (
    ALFWORLD_SYSTEM_PROMPT,
    INVALID_ACTION_HINT,
    AlfworldWorkflow,
    StepWiseAlfworldWorkflow,
    format_observation,
)
from services.explorer.workflows.alfworld_raft import (
    RAFT_SYSTEM_PROMPT,
    RAFTAlfworldWorkflow,
    RAFTReflectAlfworldWorkflow,
    parse_response,
    reward_feedback,
    well_formed,
)
from tests.fakes.env_workflows import (
    LOGPROB,
    decode,
    hide_packages,
    make_task,
    model_text,
    other_text,
    pretend_packages,
    stand_in,
)

# --- ALFWorld ----------------------------------------------------------------------------------------


class FakeAlfworldEnv:
    """TextWorld's single-game gym interface: reset() -> (obs, infos); step(cmd) -> (obs, score, done, infos)."""

    def __init__(
        self,
        outcomes: list[tuple[str, float, bool]],
        first: str = "You are in a room. Your task is to: put a mug on the desk.",
    ) -> None:
        self.outcomes = list(outcomes)
        self.first = first
        self.commands: list[str] = []
        self.resets = 0
        self.closed = False

    def reset(self) -> tuple[str, dict[str, Any]]:
        self.resets += 1
        return self.first, {"admissible_commands": ["look"]}

    def step(self, command: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.commands.append(command)
        obs, score, done = self.outcomes.pop(0) if self.outcomes else ("Nothing happens.", 0.0, False)
        return obs, score, done, {}

    def close(self) -> None:
        self.closed = True


ALF_RAW = {"game_file": "/data/json_2.1.1/train/pick/trial/game.tw-pddl"}


def test_alfworld_observation_gets_a_hint_after_nothing_happens() -> None:
    assert format_observation("You open the drawer.") == "Observation: You open the drawer."
    assert format_observation("Nothing happens.") == "Observation: Nothing happens." + INVALID_ACTION_HINT


def test_alfworld_preflight_names_the_packages_and_the_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide_packages(monkeypatch, "alfworld", "textworld")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    for cls in (
        AlfworldWorkflow,
        StepWiseAlfworldWorkflow,
        RAFTAlfworldWorkflow,
        RAFTReflectAlfworldWorkflow,
    ):
        problems = cls.preflight({})
        assert len(problems) == 3, problems
        assert f"{cls.__name__} needs the Python package 'alfworld'" in problems[0]
        assert "alfworld-download" in problems[0]
        assert "'textworld'" in problems[1]
        assert f"{tmp_path}/json_2.1.1 does not exist" in problems[2] and "ALFWORLD_DATA" in problems[2]
    pretend_packages(monkeypatch, "alfworld", "textworld")
    (tmp_path / "json_2.1.1").mkdir()
    assert AlfworldWorkflow.preflight({}) == []


def test_alfworld_workflow_plays_one_game_into_one_experience(make_model: Any) -> None:
    replies = [
        "<think>find it</think><action>go to desk 1</action>",
        "<think>hmm</think><action>fly</action>",
        "<think>done</think><action>move mug 1 to desk 1</action>",
    ]
    model, scripted = make_model(replies)
    env = FakeAlfworldEnv(
        [
            ("On the desk 1, you see a mug 1.", 0.0, False),
            ("Nothing happens.", 0.0, False),
            ("You won!", 1.0, True),
        ]
    )
    cls = stand_in(AlfworldWorkflow, env)
    [exp] = cls(task=make_task("alfworld_workflow", ALF_RAW, prompt_key="game_file"), model=model).run()
    assert cls.made == [(ALF_RAW["game_file"],)]
    normalize_experience(exp, 1)  # shapes agree, as the runner checks
    assert env.commands == ["go to desk 1", "fly", "move mug 1 to desk 1"]
    assert env.closed
    assert exp.reward == 1.0
    assert exp.metrics == {"env_rounds": 2.0, "env_done": 1.0}
    # the prompt is the system prompt and the first observation; the model's text is exactly its replies
    assert (
        decode(model, exp.tokens[: exp.prompt_length]) == ALFWORLD_SYSTEM_PROMPT + "Observation: " + env.first
    )
    assert model_text(model, exp) == "".join(r + "<eos>" for r in replies)
    assert other_text(model, exp) == (
        "Observation: On the desk 1, you see a mug 1." + "Observation: Nothing happens." + INVALID_ACTION_HINT
    )
    assert exp.logprobs is not None and exp.action_mask is not None
    assert np.all(exp.logprobs[exp.action_mask] == LOGPROB) and np.all(exp.logprobs[~exp.action_mask] == 0)
    assert len(scripted.prompts) == 3


def test_alfworld_unfinished_game_scores_minus_a_tenth(make_model: Any) -> None:
    model, scripted = make_model(["<action>look</action>"] * 2)
    env = FakeAlfworldEnv([("You see a room.", 0.0, False)] * 5)
    task = make_task("alfworld_workflow", ALF_RAW, prompt_key="game_file", workflow_args={"max_env_steps": 2})
    [exp] = stand_in(AlfworldWorkflow, env)(task=task, model=model).run()
    assert exp.reward == pytest.approx(-0.1)
    assert exp.metrics == {"env_rounds": 1.0, "env_done": 0.0}
    assert env.commands == ["look", "look"] and len(scripted.prompts) == 2


def test_step_wise_alfworld_one_experience_per_call_with_the_run_reward(make_model: Any) -> None:
    replies = ["<action>go to desk 1</action>", "<action>take mug 1</action>", "<action>put mug 1</action>"]
    model, _ = make_model(replies, enable_history=True)
    outcomes = [
        ("You arrive at desk 1.", 0.0, False),
        ("You pick up the mug 1.", 0.0, False),
        ("Done.", 1.0, True),
    ]
    env = FakeAlfworldEnv(outcomes)
    task = make_task("step_wise_alfworld_workflow", ALF_RAW, prompt_key="game_file")
    exps = stand_in(StepWiseAlfworldWorkflow, env)(task=task, model=model).run()
    assert [e.step for e in exps] == [0, 1, 2]
    for exp in exps:
        normalize_experience(exp, 1)
    assert [e.reward for e in exps] == [1.0, 1.0, 1.0]
    assert all(e.metrics["actual_env_steps"] == 3.0 for e in exps)
    shown = [
        "Observation: " + env.first,
        "Observation: You arrive at desk 1.",
        "Observation: You pick up the mug 1.",
    ]
    assert [e.info["env_state_hash"] for e in exps] == [hashlib.sha256(s.encode()).hexdigest() for s in shown]
    assert [e.info["step_reward"] for e in exps] == [0.0, 0.0, 1.0]
    for exp, reply in zip(exps, replies, strict=True):
        assert exp.action_mask is not None and exp.action_mask.all()  # the response is the model's text only
        assert exp.response_text == reply
    # each call's prompt is the whole chat so far (builtin template: the contents in order)
    assert (
        decode(model, exps[2].tokens[: exps[2].prompt_length])
        == ALFWORLD_SYSTEM_PROMPT
        + "".join(s + r for s, r in zip(shown[:2], replies[:2], strict=True))
        + shown[2]
    )
    assert env.closed


def test_step_wise_alfworld_unfinished_run_and_history_requirement(make_model: Any) -> None:
    model, _ = make_model(["<action>look</action>"] * 2, enable_history=True)
    env = FakeAlfworldEnv([("A room.", 0.0, False)] * 3)
    task = make_task(
        "step_wise_alfworld_workflow", ALF_RAW, prompt_key="game_file", workflow_args={"max_env_steps": 2}
    )
    exps = stand_in(StepWiseAlfworldWorkflow, env)(task=task, model=model).run()
    assert [e.step for e in exps] == [0, 1] and all(e.reward == pytest.approx(-0.1) for e in exps)
    plain, _ = make_model([])
    with pytest.raises(InvalidArgument, match="enable_history"):
        stand_in(StepWiseAlfworldWorkflow, env)(task=task, model=plain)


# --- RAFT ----------------------------------------------------------------------------------------------


def raft_reply(action: str, experience: str = "Explore first.") -> str:
    return f"<experience>{experience}</experience>\n\n<think>next</think>\n\n<action>{action}</action>"


def test_raft_response_parsing_and_format_rule() -> None:
    parsed = parse_response(
        "<experience> Check drawers. </experience>x<think>go</think><action> open drawer 1 </action>"
    )
    assert parsed == {"experience": "Check drawers.", "think": "go", "action": "open drawer 1"}
    assert well_formed(parsed)
    # all three tags are needed, in order; a part that is only whitespace is not well formed
    assert parse_response("<think>go</think><action>look</action>") == {
        "experience": "",
        "think": "",
        "action": "",
    }
    assert not well_formed(parse_response("<experience>a</experience><think> </think><action>look</action>"))


def test_raft_reward_feedback_sentences() -> None:
    assert reward_feedback(1.0, 5, True, 50) == (
        "In your attempt, you successfully completed the task in 5 steps with a reward of 1.000. "
        "Try to maintain this success while being more efficient."
    )
    assert reward_feedback(0.5, 7, True, 50).startswith(
        "In your attempt, you completed the task in 7 steps but only"
    )
    assert "maximum step limit of 2 steps without completing the task (reward: 0.000)" in reward_feedback(
        0.0, 2, False, 2
    )
    assert reward_feedback(0.0, 3, False, 50).startswith(
        "In your attempt, you stopped after 3 steps with a reward of 0.000"
    )


def test_raft_keeps_a_successful_well_formed_game(make_model: Any) -> None:
    replies = [raft_reply("go to desk 1"), raft_reply("put mug 1 on desk 1")]
    model, scripted = make_model(replies)
    env = FakeAlfworldEnv([("You arrive.", 0.0, False), ("Done.", 1.0, True)])
    task = make_task(
        "RAFT_alfworld_workflow",
        ALF_RAW,
        prompt_key="game_file",
        rollout_args=RolloutArgs(n=1, temperature=0.85, top_k=25, top_p=0.95),
    )
    [exp] = stand_in(RAFTAlfworldWorkflow, env)(task=task, model=model).run()
    assert exp.reward == 1.0 and exp.metrics == {"success": 1.0, "reward": 1.0, "steps": 2.0}
    assert model_text(model, exp) == "".join(r + "<eos>" for r in replies)
    assert decode(model, exp.tokens[: exp.prompt_length]).startswith(RAFT_SYSTEM_PROMPT)
    assert len(scripted.prompts) == 2


def test_raft_three_identical_actions_end_the_game_as_a_placeholder(make_model: Any) -> None:
    model, scripted = make_model([raft_reply("look")] * 3)
    env = FakeAlfworldEnv([("A room.", 0.0, False)] * 5)
    [exp] = stand_in(RAFTAlfworldWorkflow, env)(
        task=make_task("RAFT_alfworld_workflow", ALF_RAW, prompt_key="game_file"), model=model
    ).run()
    assert env.commands == ["look", "look"]  # the third "look" is not sent
    normalize_experience(exp, 1)
    assert exp.metrics == {"success": 0.0, "reward": 0.0, "steps": 3.0}
    assert exp.tokens.tolist() == [0] and exp.action_mask is not None and not exp.action_mask.any()


def test_raft_success_with_a_malformed_reply_is_not_kept_and_eval_reports(make_model: Any) -> None:
    model, _ = make_model(["<action>put mug</action>", raft_reply("put mug")])
    env = FakeAlfworldEnv([("Done.", 1.0, True), ("Done.", 1.0, True)])
    cls = stand_in(RAFTAlfworldWorkflow, env)
    [exp] = cls(task=make_task("RAFT_alfworld_workflow", ALF_RAW, prompt_key="game_file"), model=model).run()
    assert exp.metrics == {"success": 1.0, "reward": 1.0, "steps": 1.0} and exp.action_mask is not None
    assert not exp.action_mask.any()
    eval_task = make_task("RAFT_alfworld_workflow", ALF_RAW, prompt_key="game_file", is_eval=True)
    [report] = cls(task=eval_task, model=model).run()
    assert report.metrics == {"success": 1.0, "reward": 1.0, "steps": 1.0} and report.info["success"] is True


def test_raft_reflect_replays_with_feedback_and_keeps_the_fresh_second_chat(
    make_model: Any, tmp_path: Path
) -> None:
    first = [raft_reply("look"), raft_reply("open drawer 1")]
    second = [raft_reply("put mug 1 on desk 1", experience="Put things where asked.")]
    model, scripted = make_model(first + second)
    env = FakeAlfworldEnv(
        [("A room.", 0.0, False), ("The drawer is empty.", 0.0, False), ("Done.", 1.0, True)]
    )
    task = make_task(
        "RAFT_reflect_alfworld_workflow",
        ALF_RAW,
        prompt_key="game_file",
        workflow_args={"max_env_steps": 2, "save_dir": str(tmp_path)},
    )
    [exp] = stand_in(RAFTReflectAlfworldWorkflow, env)(task=task, model=model).run()
    assert env.resets == 2 and env.commands == ["look", "open drawer 1", "put mug 1 on desk 1"]
    # the second attempt read the first chat, then the feedback, then the game's first observation
    context = decode(model, scripted.prompts[2])
    assert all(r in context for r in first)
    assert (
        "you reached the maximum step limit of 2 steps without completing the task (reward: 0.000)" in context
    )
    assert "This is your second attempt." in context
    assert context.endswith("Observation: " + env.first)
    # the kept chat is a fresh conversation: system prompt, observation, the second reply only
    assert decode(model, exp.tokens) == RAFT_SYSTEM_PROMPT + "Observation: " + env.first + second[0] + "<eos>"
    assert model_text(model, exp) == second[0] + "<eos>"
    assert exp.logprobs is None  # sampled under another context: the trainer recomputes them
    assert exp.reward == 1.0
    assert exp.metrics == {
        "reward": 0.0,
        "steps": 2.0,
        "trajectory_length": 1.0,
        "second_reward": 1.0,
        "second_steps": 1.0,
        "improvement": 1.0,
    }
    [saved] = (tmp_path / "sft_data").glob("*.json")
    record = json.loads(saved.read_text())
    assert record["kept_for_sft"] is True and record["game_file"] == ALF_RAW["game_file"]
    assert record["first_exploration"]["reward"] == 0.0 and record["second_exploration"]["success"] is True


def test_raft_reflect_drops_a_second_attempt_that_is_no_better(make_model: Any, tmp_path: Path) -> None:
    model, _ = make_model([raft_reply("look"), raft_reply("look")])
    env = FakeAlfworldEnv([("A room.", 0.0, False)] * 4)
    task = make_task(
        "RAFT_reflect_alfworld_workflow",
        ALF_RAW,
        prompt_key="game_file",
        workflow_args={"max_env_steps": 1, "save_dir": str(tmp_path)},
    )
    [exp] = stand_in(RAFTReflectAlfworldWorkflow, env)(task=task, model=model).run()
    assert exp.action_mask is not None and not exp.action_mask.any()
    assert exp.info == {"error_reason": "Unknown error", "rollout_failed": True}
    assert len(list((tmp_path / "non_sft_data").glob("*.json"))) == 1


# --- trinity config check -----------------------------------------------------------------------------


def test_config_check_reports_what_alfworld_workflow_lacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide_packages(monkeypatch, "alfworld", "textworld")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alfworld"))
    data = tmp_path / "games.jsonl"
    data.write_text(json.dumps(ALF_RAW) + "\n")
    config = tmp_path / "alfworld.yaml"
    config.write_text(
        f"""
checkpoint_root_dir: {tmp_path}/runs
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
buffer:
  explorer_input:
    taskset:
      name: alfworld
      storage_type: file
      path: {data}
      format: {{prompt_key: game_file}}
      workflow_args: {{max_env_steps: 30}}
    default_workflow_type: alfworld_workflow
"""
    )
    _cfg, report = check_file(str(config), [])
    key = "buffer.explorer_input.taskset.default_workflow_type"
    mine = [p for p in report.problems if p.startswith(key)]
    assert any("AlfworldWorkflow needs the Python package 'alfworld'" in p for p in mine), report.problems
    assert any("'textworld'" in p for p in mine)
    assert any(f"{tmp_path}/alfworld/json_2.1.1 does not exist" in p for p in mine)
