"""Linking a session's turns and the experiences they make, worked by hand on small ids."""

from __future__ import annotations

import numpy as np
import pytest

from services.explorer.serve.chains import ResponseReward as R
from services.explorer.serve.chains import (
    Turn,
    build_experience,
    chain,
    leaves,
    link,
    session_experiences,
    turn_rewards,
)

EOS = 2


def turn(
    turn_id: str,
    prompt: list[int],
    response: list[int],
    logprobs: list[float],
    *,
    context: str,
    reply: str,
    parent: str | None = None,
    version: int = 0,
    response_id: str | None = None,
) -> Turn:
    stopped = response[-1] == EOS
    return Turn(
        turn_id=turn_id,
        response_id=response_id or turn_id.split("/")[0],
        session_id="s",
        parent_id=parent,
        prompt_ids=np.array(prompt, dtype=np.int64),
        response_ids=np.array(response, dtype=np.int64),
        logprobs=np.array(logprobs, dtype=np.float32),
        version=version,
        context_text=context,
        reply_text=reply + ("<eos>" if stopped else ""),
        reply_open_text=reply if stopped else None,
        response_text=reply,
    )


# turn A: the engine got "Q1" as [10, 11] and sampled "ab" + EOS as [20, 21, 2]
A = turn("a/0", [10, 11], [20, 21, EOS], [-0.1, -0.2, -0.3], context="Q1", reply="ab", version=2)


def test_a_conversation_that_goes_on_extends_the_turn_whether_the_template_keeps_the_eos_or_not() -> None:
    dropped = link([A], "Q1abQ2")  # a template that writes the reply back without its EOS
    kept = link([A], "Q1ab<eos>Q2")  # one that keeps it (ChatML's <|im_end|>)
    assert dropped.parent is A and dropped.new_text == "Q2"
    assert kept.parent is A and kept.new_text == "Q2"


def test_a_rewritten_history_starts_a_new_chain() -> None:
    assert link([A], "Q1xyQ2").parent is None  # the agent edited the reply
    assert link([A], "Q0abQ2").parent is None  # ... or the first message
    assert link([A], "Q1xyQ2").new_text == "Q1xyQ2"  # all of it is tokenized afresh


def test_the_longest_matching_turn_wins() -> None:
    # B extends A: the engine got A's ids + A's sampled ids + "Q2" as [30, 31], sampled "c" + EOS
    b = turn(
        "b/0",
        [10, 11, 20, 21, EOS, 30, 31],
        [40, EOS],
        [-0.4, -0.5],
        context="Q1abQ2",
        reply="c",
        parent="a/0",
    )
    found = link([A, b], "Q1abQ2cQ3")
    assert found.parent is b and found.new_text == "Q3"


def test_two_turns_become_one_experience_with_the_mask_on_sampled_tokens_only() -> None:
    b = turn(
        "b/0",
        [10, 11, 20, 21, EOS, 30, 31],
        [40, EOS],
        [-0.4, -0.5],
        context="Q1abQ2",
        reply="c",
        parent="a/0",
        version=3,
    )
    exp = build_experience(chain(b, {"a/0": A, "b/0": b}))
    assert exp.tokens.tolist() == [10, 11, 20, 21, EOS, 30, 31, 40, EOS]
    assert exp.prompt_length == 2  # the root's prompt
    # response = [20, 21, EOS | 30, 31 | 40, EOS]: sampled, the user's text, sampled
    assert exp.action_mask.tolist() == [True, True, True, False, False, True, True]
    assert exp.logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.3, 0, 0, -0.4, -0.5])
    assert exp.model_version == 2  # the oldest version of its turns
    assert exp.info["model_versions"] == [2, 3] and exp.info["turns"] == 2
    exp.validate()


def test_a_chain_whose_ids_do_not_continue_its_parent_is_refused() -> None:
    bad = turn("b/0", [10, 11, 99, 21, EOS, 30], [40], [-0.4], context="Q1abQ", reply="c", parent="a/0")
    with pytest.raises(ValueError, match="not a prefix"):
        build_experience(chain(bad, {"a/0": A, "b/0": bad}))


def test_branches_are_leaves_and_each_takes_the_rewards_on_its_path() -> None:
    b = turn(
        "b/0", [10, 11, 20, 21, EOS, 30], [40, EOS], [-0.4, -0.5], context="Q1abQ", reply="c", parent="a/0"
    )
    c = turn(
        "c/0", [10, 11, 20, 21, EOS, 31], [41, EOS], [-0.6, -0.7], context="Q1abR", reply="d", parent="a/0"
    )
    assert [t.turn_id for t in leaves([A, b, c])] == ["b/0", "c/0"]
    by_id = {"a/0": A, "b/0": b, "c/0": c}
    rewards = {"a": R(0.5, "call-1"), "c": R(1.0, "call-2")}
    assert turn_rewards(chain(b, by_id), rewards, None) == [0.5, 0.0]  # only A's response on b's path
    assert turn_rewards(chain(c, by_id), rewards, None) == [0.5, 1.0]  # two calls: each turn its own
    assert turn_rewards(chain(b, by_id), {}, 0.25) == [0.0, 0.25]  # the session's: on the last turn
    assert turn_rewards(chain(b, by_id), {}, None) is None
    exps, unrewarded = session_experiences([A, b, c], {"c": R(1.0, "call-2")}, None)
    assert [e.reward for e in exps] == [1.0] and unrewarded == 1  # b's chain has no reward: dropped


def test_per_turn_rewards_land_on_each_turn_s_last_sampled_token_and_add_up() -> None:
    b = turn(
        "b/0",
        [10, 11, 20, 21, EOS, 30, 31],
        [40, EOS],
        [-0.4, -0.5],
        context="Q1abQ2",
        reply="c",
        parent="a/0",
    )
    path = chain(b, {"a/0": A, "b/0": b})
    # response = [20, 21, EOS | 30, 31 | 40, EOS]; A's last sampled token is position 2, b's is 6
    per_turn = {"a": R(0.5, "call-1"), "b": R(1.0, "call-2")}
    exps, _ = session_experiences([A, b], per_turn, 0.25)
    assert exps[0].token_level_rewards.tolist() == [0, 0, 0.5, 0, 0, 0, 1.25]  # b's 1.0 + the session's 0.25
    assert exps[0].reward == 1.75 and exps[0].info["turn_rewards"] == [0.5, 1.25]
    exps[0].validate()
    # Trinity's client: one call naming every response of the episode -> one reward, at the end
    episode = {"a": R(1.0, "call-3"), "b": R(1.0, "call-3")}
    assert turn_rewards(path, episode, None) == [0.0, 1.0]
    [exp], _ = session_experiences([A, b], episode, None)
    assert exp.token_level_rewards.tolist() == [0, 0, 0, 0, 0, 0, 1.0] and exp.reward == 1.0
    # a single-turn chain: the reward at its last token, as the trainer places a scalar reward
    [alone], _ = session_experiences([A], {}, 0.75)
    assert alone.token_level_rewards.tolist() == [0, 0, 0.75] and alone.reward == 0.75


def test_a_reply_echoed_without_the_special_tokens_sampled_inside_it_still_extends_its_turn() -> None:
    # the engine sampled "a", <bos> (id 1), "b": the agent got "ab" and sends "ab" back
    odd = turn("o/0", [10], [20, 1, 21], [-1.0, -1.0, -1.0], context="Q", reply="a<bos>b")
    odd.response_text = "ab"
    found = link([odd], "QabR")
    assert found.parent is odd and found.new_text == "R"  # the engine continues from its own ids
