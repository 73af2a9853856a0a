"""frozen_lake_workflow: the lake's rules on hand-worked maps, rewards, prompts, token masks.

The lake's rules and rewards are Trinity-RFT's (gymnasium's FrozenLake driven by its workflow); the
maps and slips recorded below were produced by gymnasium 1.2.0 with Trinity's map generator for the
same seeds, so they pin this port to Trinity's draw order. The workflow also runs once end to end
on the builtin `tiny-30m` model: Trinity's turn text (~170 characters per lake turn) does not fit
the 256 positions of `tiny-arith`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.common.config.buffer import FormatConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows import WORKFLOWS, Task
from services.explorer.workflows.base import RolloutArgs
from services.explorer.workflows.frozen_lake import FrozenLakeWorkflow, turn_continuation
from services.explorer.workflows.frozen_lake_env import (
    FrozenLake,
    generate_random_map,
    parse_action,
    reaches_goal,
)
from services.explorer.workflows.frozen_lake_prompts import INVALID_MOVE_NOTE, SYSTEM_PROMPT, user_turn

LEFT, DOWN, RIGHT, UP = 1, 2, 3, 4
LAKE = ["SFF", "FHF", "FFG"]  # start top left, hole in the middle, goal bottom right
EOT = "\x03"  # the fake chat template's end of turn: one character, so one token


# --- the lake -------------------------------------------------------------------------------------


def test_render_marks_player_holes_and_goal() -> None:
    lake = FrozenLake(LAKE)
    assert lake.reset(seed=0) == " P \t _ \t _ \t\n _ \t O \t _ \t\n _ \t _ \t G \t"


def test_right_right_down_down_reaches_the_goal() -> None:
    lake = FrozenLake(LAKE)
    lake.reset(seed=0)
    results = [lake.step(a) for a in (RIGHT, RIGHT, DOWN, DOWN)]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 1.0]
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].observation == " _ \t _ \t _ \t\n _ \t O \t _ \t\n _ \t _ \t √ \t"
    # standing on the goal: Trinity's env answers reward 1, done, without moving
    again = lake.step(LEFT)
    assert (again.reward, again.done, again.moved, lake.position) == (1.0, True, False, (2, 2))


def test_down_right_falls_into_the_hole() -> None:
    lake = FrozenLake(LAKE)
    lake.reset(seed=0)
    first = lake.step(DOWN)
    assert (first.reward, first.done, first.moved, lake.position) == (0.0, False, True, (1, 0))
    second = lake.step(RIGHT)
    assert (second.reward, second.done, lake.position) == (0.0, True, (1, 1))
    assert second.observation.splitlines()[1] == " _ \t X \t _ \t"


def test_invalid_action_and_wall_leave_the_player_in_place() -> None:
    lake = FrozenLake(LAKE)
    lake.reset(seed=0)
    invalid = lake.step(0)
    assert (invalid.reward, invalid.done, invalid.moved, lake.position) == (0.0, False, False, (0, 0))
    wall = lake.step(UP)
    assert (wall.done, wall.moved, lake.position) == (False, False, (0, 0))


def test_parse_action_reads_the_last_fenced_block() -> None:
    assert parse_action("I should go up. ```Up```") == UP
    assert parse_action("```left``` no, better ``` Down ```") == DOWN
    assert parse_action("```3```") == RIGHT
    assert parse_action("```5```") == 0
    assert parse_action("Right") == 0  # no fenced block
    assert parse_action("```Right please```") == 0


def test_reaches_goal_counts_moves_like_trinity() -> None:
    assert not reaches_goal([list("SH"), list("HG")], max_steps=5)
    assert reaches_goal([list("SF"), list("HG")], max_steps=5)
    # the only path S (0,0) -> (0,1) -> (0,2) -> (1,2) -> (2,2) -> (2,1) -> G (2,0) is 6 moves;
    # the check expands tiles reached within max_steps, so the tile before G (5 moves) must be
    corridor = [list("SFF"), list("HHF"), list("GFF")]
    assert reaches_goal(corridor, max_steps=5)
    assert not reaches_goal(corridor, max_steps=4)


def test_generated_maps_match_trinity_for_the_same_seed() -> None:
    # recorded from Trinity's generate_random_map on gymnasium 1.2.0
    assert generate_random_map(size=4, p=0.8, seed=42, max_steps=8) == (
        ["FFSF", "FHFF", "FFFH", "GHFF"],
        (3, 0),
    )
    desc, goal = generate_random_map(size=6, p=0.7, seed=2024, max_steps=8)
    assert desc == ["HFFFHS", "FHFFFF", "GFFFFF", "FFFFFF", "FHFFFF", "FFFFFF"] and goal == (2, 0)
    with pytest.raises(InvalidArgument, match="size >= 2"):
        generate_random_map(size=1, seed=0)


def test_slippery_moves_follow_gymnasium_for_the_seed() -> None:
    lake = FrozenLake(["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"], is_slippery=True)
    lake.reset(seed=3)
    positions = []
    for action in (RIGHT, RIGHT, DOWN, LEFT, UP, DOWN):
        lake.step(action)
        positions.append(lake.position)
    # gymnasium 1.2.0, reset(seed=3): Right slid down, Right slid up, Left slid up
    assert positions == [(3, 2), (2, 2), (3, 2), (2, 2), (1, 2), (2, 2)]


def test_slippery_right_never_goes_left() -> None:
    outcomes = set()
    for seed in range(60):
        lake = FrozenLake(["FFF", "FSF", "FFF"], is_slippery=True)
        lake.reset(seed=seed)
        lake.step(RIGHT)
        outcomes.add(lake.position)
    assert outcomes == {(1, 2), (0, 1), (2, 1)}  # right, or perpendicular: up / down


# --- the frozen lake workflow on canned replies ------------------------------------------------------


class ScriptedTokenModel:
    """A char-level chat model: one token per character, replies from a script, each ended by EOT."""

    max_prompt_tokens = 4000
    max_response_tokens = 1000
    model_version = 0

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[list[int], dict[str, Any]]] = []

    def render_chat(self, messages: list[dict[str, Any]], tools: Any = None) -> str:
        return "".join(f"[{m['role']}]{m['content']}{EOT}" for m in messages) + "[assistant]"

    def tokenize(self, text: str) -> list[int]:
        return [ord(ch) for ch in text]

    async def generate_tokens_async(self, prompt_ids: list[int], **kwargs: Any) -> list[Experience]:
        self.calls.append((list(prompt_ids), kwargs))
        reply = self.replies.pop(0)
        ids = self.tokenize(reply + EOT)
        return [
            Experience(
                tokens=np.asarray(prompt_ids + ids),
                prompt_length=len(prompt_ids),
                model_version=0,
                logprobs=np.full(len(ids), -0.5, dtype=np.float32),
                response_text=reply,
                info={"finish_reason": "stop"},
            )
        ]


def lake_task(**workflow_args: Any) -> Task:
    return Task(
        workflow=WORKFLOWS.get("frozen_lake_workflow"),
        workflow_args={"desc": LAKE, **workflow_args},
        rollout_args=RolloutArgs(n=1, temperature=0.7),
        raw_task={"seed": 0},
    )


def text_of(ids: np.ndarray) -> str:
    return "".join(chr(i) for i in ids.tolist())


async def test_winning_episode_is_one_experience_with_masks_on_the_replies() -> None:
    replies = ["```Right```", "go ```Right```", "```Down```", "```down```"]
    model = ScriptedTokenModel(replies)
    (exp,) = await lake_task(agent_max_steps=5).to_workflow(model).run_async()
    start = " P \t _ \t _ \t\n _ \t O \t _ \t\n _ \t _ \t G \t"
    after_right = " _ \t P \t _ \t\n _ \t O \t _ \t\n _ \t _ \t G \t"
    turn0 = (
        f"Current Observation (0): \n{start}\n"
        "You have not achieved the goal, P has not reached G yet. Please give the next action.\n"
        "The maximum number of steps remaining is 5."
    )
    turn1 = (
        f"Current Observation (1): \n{after_right}\n"
        "You have not achieved the goal, P has not reached G yet. Please give the next action.\n"
        "The maximum number of steps remaining is 4."
    )
    assert (
        text_of(exp.tokens[: exp.prompt_length])
        == f"[system]{SYSTEM_PROMPT}{EOT}[user]{turn0}{EOT}[assistant]"
    )
    # after each reply (which ended with EOT itself) comes the next user turn, action mask 0
    inserted = f"[user]{turn1}{EOT}[assistant]"
    response = text_of(exp.tokens[exp.prompt_length :])
    assert response.startswith(f"```Right```{EOT}{inserted}go ```Right```{EOT}[user]Current Observation (2)")
    assert response.endswith(f"```down```{EOT}")
    mask = exp.action_mask.tolist()
    reply0, reply1 = len(replies[0]) + 1, len(replies[1]) + 1
    assert mask[:reply0] == [True] * reply0
    assert mask[reply0 : reply0 + len(inserted)] == [False] * len(inserted)
    assert mask[reply0 + len(inserted) : reply0 + len(inserted) + reply1] == [True] * reply1
    # model tokens = the four replies and their EOTs; every other response token was inserted
    assert sum(mask) == sum(len(r) + 1 for r in replies)
    assert exp.logprobs.tolist() == [-0.5 if m else 0.0 for m in mask]
    assert exp.reward == 1.0 and exp.info == {"env_steps": 4, "env_done": 1, "test_score": 1.0}
    assert exp.metrics == {"env_steps": 4.0, "env_done": 1.0, "accuracy": 1.0}
    # each call saw the whole context so far, one sample, max_tokens = what is left of the budget
    prompts = [p for p, _ in model.calls]
    assert all(np.array_equal(exp.tokens[: len(p)], p) for p in prompts)
    assert model.calls[0][1] == {"n": 1, "temperature": 0.7, "max_tokens": 1000}
    assert model.calls[1][1]["max_tokens"] == 1000 - reply0 - len(inserted)
    assert [m.role for m in exp.messages] == ["system", "user", "assistant"] * 1 + ["user", "assistant"] * 3
    exp.validate()


async def test_hole_ends_the_episode_with_reward_zero() -> None:
    model = ScriptedTokenModel(["```Down```", "```Right```", "```Right```"])
    (exp,) = await lake_task().to_workflow(model).run_async()
    assert exp.reward == 0.0 and exp.info["env_done"] == 1 and exp.info["env_steps"] == 2
    assert exp.metrics["accuracy"] == 0.0 and len(model.replies) == 1  # the third reply was never asked for


async def test_an_invalid_reply_is_pointed_out_and_steps_run_out() -> None:
    model = ScriptedTokenModel(["I will go up", "```Up```"])
    (exp,) = await lake_task(agent_max_steps=2).to_workflow(model).run_async()
    second_user = exp.messages[3].content
    assert second_user == user_turn(1, FrozenLake(LAKE).reset(0), unchanged=True, steps_left=1)
    assert second_user.endswith(INVALID_MOVE_NOTE + "\nThe maximum number of steps remaining is 1.")
    assert exp.reward == 0.0 and exp.info == {"env_steps": 2, "env_done": 0, "test_score": 0.0}


async def test_response_budget_cuts_the_episode_before_the_next_turn() -> None:
    task = lake_task()
    task.rollout_args = RolloutArgs(n=1, max_response_tokens=40, max_tokens=25)
    model = ScriptedTokenModel(["```Right```", "```Right```"])
    (exp,) = await task.to_workflow(model).run_async()
    # the next user turn (> 100 tokens) leaves no room; it is dropped again and the episode ends
    assert model.calls[0][1] == {"n": 1, "max_tokens": 25}  # min(rollout max_tokens, budget 40)
    assert text_of(exp.tokens[exp.prompt_length :]) == f"```Right```{EOT}"
    assert exp.action_mask.all() and exp.info["truncate_status"] == "response_truncated"
    assert exp.info["env_steps"] == 1 and exp.reward == 0.0 and exp.messages[-1].role == "assistant"


def sum_of_lengths(response: str, messages: list[dict[str, str]]) -> dict[str, float]:
    """A trajectory reward for the test: the number of messages."""
    return {"reward": float(len(messages)), "reply_chars": float(len(response))}


async def test_reward_fn_type_scores_the_whole_chat() -> None:
    task = lake_task(reward_fn_type=f"{__name__}:sum_of_lengths")
    (exp,) = await task.to_workflow(ScriptedTokenModel(["```Down```", "```Right```"])).run_async()
    assert exp.reward == 5.0  # system, user, assistant, user, assistant
    broken = lake_task(reward_fn_type=f"{__name__}:sum_of_lengths", reward_fn_args={"unknown": 1})
    (exp,) = await broken.to_workflow(ScriptedTokenModel(["```Down```", "```Right```"])).run_async()
    assert exp.reward == 0.0  # the fn raised: the game's reward stands (hole: 0)


async def test_map_from_the_task_row_and_reset() -> None:
    task = Task(
        workflow=FrozenLakeWorkflow,
        raw_task={"size": 4, "p": 0.8, "seed": 42},
        workflow_args={"max_steps": 8},
        format_args=FormatConfig(system_prompt="Play."),
    )
    workflow = task.to_workflow(ScriptedTokenModel([]))
    assert isinstance(workflow, FrozenLakeWorkflow)
    assert workflow.lake.desc == ["FFSF", "FHFF", "FFFH", "GHFF"]  # Trinity's map for seed 42
    assert (workflow.env_max_steps, workflow.agent_max_steps, workflow.system_prompt) == (8, 8, "Play.")
    workflow.reset(lake_task(env_max_steps=3, agent_max_steps=2, is_slippery=True))
    assert workflow.lake.desc == LAKE and workflow.lake.is_slippery and workflow.agent_max_steps == 2


def test_turn_continuation_is_the_template_text_between_reply_and_next_prompt() -> None:
    messages = [
        {"role": "user", "content": "u0"},
        {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "u1"},
    ]
    assert turn_continuation(ScriptedTokenModel([]), messages) == f"{EOT}[user]u1{EOT}[assistant]"
    # a ChatML template (Qwen's layout) through the real ModelWrapper
    from services.explorer.model_wrapper import ModelWrapper
    from services.models.loading import builtin_tokenizer

    chatml = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    wrapper = ModelWrapper(None, builtin_tokenizer(), chat_template=chatml)  # type: ignore[arg-type]
    continuation = turn_continuation(wrapper, messages)
    assert continuation == "<|im_end|>\n<|im_start|>user\nu1<|im_end|>\n<|im_start|>assistant\n"


# --- end to end on a real model -----------------------------------------------------------------


async def test_frozen_lake_on_tiny_model(tiny_30m: Any) -> None:
    """The model cannot play; the run shows the plumbing: one experience, masks on the sampled tokens only."""
    from services.explorer.model_wrapper import ModelWrapper
    from services.explorer.runner import VersionRef, WorkflowRunner

    engine, tok = tiny_30m
    wrapper = ModelWrapper(engine, tok, max_prompt_tokens=1000, max_response_tokens=800)
    runner = WorkflowRunner(
        lambda i: wrapper, slots=1, max_timeout=120, max_retry_times=0, version_fn=VersionRef(2)
    )
    task = Task(
        workflow=WORKFLOWS.get("frozen_lake_workflow"),
        raw_task={"size": 3, "p": 0.8, "seed": 7},
        workflow_args={"agent_max_steps": 2},
        format_args=FormatConfig(system_prompt=""),  # Trinity's system prompt alone is over 1,000 tokens
        rollout_args=RolloutArgs(n=1, temperature=1.0, max_tokens=6),
        repeat_times=2,
        task_id="lake",
    )
    results = await runner.run_tasks([task])
    exps = [e for r in results for e in r.experiences]
    assert len(exps) == 2 and not any(r.skipped for r in results)
    for exp in exps:
        # a move needs a fenced block, ```Up``` at the shortest: 8 tokens, more than the 6 allowed
        assert exp.model_version == 2 and exp.reward == 0.0
        assert exp.info == {"env_steps": 2, "env_done": 0, "test_score": 0.0, "taskset": ""}
        users = [i for i, m in enumerate(exp.messages) if m.role == "user"]
        replies = [m for m in exp.messages if m.role == "assistant"]
        assert len(users) == len(replies) == 2
        assert exp.tokens[: exp.prompt_length].tolist() == wrapper.tokenize(exp.messages[0].content)
        # the response alternates sampled runs (mask 1) and inserted user turns (mask 0)
        response = exp.tokens[exp.prompt_length :].tolist()
        runs, start = [], 0
        mask = exp.action_mask.tolist()
        for i in range(1, len(mask) + 1):
            if i == len(mask) or mask[i] != mask[start]:
                runs.append((mask[start], response[start:i], exp.logprobs[start:i]))
                start = i
        assert [m for m, _, _ in runs] == [True, False, True]
        for k, (is_model, ids, logprobs) in enumerate(runs):
            if is_model:
                assert 1 <= len(ids) <= 6 and (logprobs <= 0).all() and (logprobs < 0).any()
            else:
                messages = [
                    {"role": m.role, "content": m.content} for m in exp.messages[: users[k // 2 + 1] + 1]
                ]
                assert ids == wrapper.tokenize(turn_continuation(wrapper, messages))
                assert (logprobs == 0).all()
