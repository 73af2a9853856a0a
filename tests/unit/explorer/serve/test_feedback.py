"""Feedback and commit rules over a real SQLite history: idempotency, conflicts, groups, expiry."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import sqlalchemy as sa

from services.explorer.serve import feedback as F
from services.explorer.serve.chains import Turn
from services.explorer.serve.core import record_turns, session_turns
from services.explorer.serve.history import History
from services.explorer.serve.protocol import ApiError


@pytest.fixture
def history(tmp_path: pathlib.Path):
    store = History(f"sqlite:///{tmp_path / 'h.db'}")
    yield store
    store.close()


def one_turn(rid: str, sid: str, response: list[int], parent: str | None = None) -> Turn:
    return Turn(
        turn_id=f"{rid}/0",
        response_id=rid,
        session_id=sid,
        parent_id=parent,
        prompt_ids=np.array([5, 6], dtype=np.int64),
        response_ids=np.array(response, dtype=np.int64),
        logprobs=np.full(len(response), -0.5, dtype=np.float32),
        version=0,
        context_text="q",
        reply_text="r",
    )


def session(history: History, sid: str, rid: str, now: float = 100.0) -> None:
    history.call(record_turns, sid, [one_turn(rid, sid, [7, 8])], False, now)


def feedback(history: History, body: dict, now: float = 100.0) -> dict:
    return history.call(F.apply_feedback, F.parse_feedback(body), now)


def error(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args)
    return info.value


def test_the_same_feedback_twice_is_one_reward_and_a_different_one_a_conflict(history: History) -> None:
    session(history, "s1", "r1")
    assert feedback(history, {"msg_ids": ["r1"], "reward": 1.0, "task_id": "t"})["rewarded"] == ["r1"]
    again = feedback(history, {"msg_ids": ["r1"], "reward": 1.0, "task_id": "t"})
    assert again["rewarded"] == [] and again["unchanged"] == ["r1"]
    conflict = error(feedback, history, {"msg_ids": ["r1"], "reward": 0.0})
    assert conflict.status == 409 and "already has reward 1.0" in conflict.message
    other_task = error(feedback, history, {"session_id": "s1", "reward": 1.0, "task_id": "u"})
    assert other_task.status == 409 and other_task.param == "task_id"
    counters = history.call(F.stats)["counters"]
    assert counters["feedback_recorded"] == 1 and counters["feedback_repeated"] == 1


def test_an_unknown_id_changes_nothing_even_next_to_a_known_one(history: History) -> None:
    session(history, "s1", "r1")
    missing = error(feedback, history, {"msg_ids": ["r1", "nope"], "reward": 1.0})
    assert missing.status == 404 and "nope" in missing.message
    assert feedback(history, {"msg_ids": ["r1"], "reward": 0.5})["rewarded"] == ["r1"]  # r1 had no reward yet
    assert error(feedback, history, {"session_id": "ghost", "reward": 1.0}).status == 404
    assert error(F.parse_feedback, {"msg_ids": ["r1"], "session_id": "s1", "reward": 1}).status == 400
    assert error(F.parse_feedback, {"msg_ids": ["r1"], "reward": float("nan")}).param == "reward"


def test_sessions_of_one_task_are_written_as_one_group_of_repeat_times(history: History) -> None:
    for i in range(3):
        session(history, f"s{i}", f"r{i}")
        feedback(history, {"session_id": f"s{i}", "reward": float(i), "task_id": "t"})
    first, keys = history.call(F.commit, F.CommitRequest(["s0"], None), 2, 101.0)
    assert keys == [] and first["committed"][0]["group"] is None  # waits for a second rollout of t
    second, keys = history.call(F.commit, F.CommitRequest(["s1", "s2"], None), 2, 102.0)
    assert keys == ["t#0"]  # s0 and s1; s2 waits for the next one
    rows = history.call(F.group_experiences, "t#0", "proxy")
    assert [(r.group_id, r.run_id, r.reward, r.task_id) for r in rows] == [
        ("t#0", 0, 0.0, "t"),
        ("t#0", 1, 1.0, "t"),
    ]
    again, keys = history.call(F.commit, F.CommitRequest(["s1"], None), 2, 103.0)
    assert keys == [] and again["committed"][0]["group"] == "t#0"  # a repeated commit changes nothing
    assert history.call(F.pending_groups) == ["t#0"]
    history.call(F.mark_written, "t#0")
    assert history.call(F.pending_groups) == []


def test_a_session_is_closed_by_its_commit(history: History) -> None:
    session(history, "s1", "r1")
    no_reward = error(history.call, F.commit, F.CommitRequest(["s1"], None), 1, 101.0)
    assert no_reward.status == 409 and no_reward.code == "no_reward"
    feedback(history, {"session_id": "s1", "reward": 1.0})
    _, keys = history.call(F.commit, F.CommitRequest(["s1"], None), 1, 102.0)
    assert keys == ["s1#0"]  # no task id given: the session is its own task
    assert error(history.call, session_turns, "s1").status == 409  # no more turns in it
    late = error(feedback, history, {"msg_ids": ["r1"], "reward": 1.0})
    assert late.status == 409 and "committed" in late.message
    assert feedback(history, {"session_id": "s1", "reward": 1.0})["unchanged"] == ["s1"]


def test_commit_without_a_body_takes_every_rewarded_open_session(history: History) -> None:
    session(history, "s1", "r1")
    session(history, "s2", "r2")
    feedback(history, {"msg_ids": ["r2"], "reward": 1.0, "task_id": "t"})
    reply, keys = history.call(F.commit, F.parse_commit(None), 1, 101.0)
    assert [c["session_id"] for c in reply["committed"]] == ["s2"] and keys == ["t#0"]


def test_idle_sessions_expire_and_a_waiting_group_is_written_short(history: History) -> None:
    session(history, "idle", "r0", now=0.0)
    session(history, "done", "r1", now=0.0)
    feedback(history, {"session_id": "done", "reward": 1.0, "task_id": "t"}, now=0.0)
    _, keys = history.call(F.commit, F.CommitRequest(["done"], None), 4, 0.0)
    assert keys == []
    expired, keys = history.call(F.expire, 100.0, 50.0, 4)
    assert expired == 1 and keys == ["t#0"]
    assert error(feedback, history, {"session_id": "idle", "reward": 1.0}).status == 410
    counters = history.call(F.stats)["counters"]
    assert counters["sessions_expired"] == 1 and counters["partial_groups"] == 1


def test_a_session_sampled_unlike_the_trainer_s_logprobs_is_refused_at_commit(history: History) -> None:
    hot = one_turn("r1", "s1", [7, 8])
    hot.sampling = (0.7, 1.0, 0)
    history.call(record_turns, "s1", [hot], False, 100.0)
    feedback(history, {"session_id": "s1", "reward": 1.0})
    mismatch = error(history.call, F.commit, F.CommitRequest(["s1"], None), 1, 101.0, (1.0, 1.0, 0))
    assert (
        mismatch.status == 409
        and mismatch.code == "sampling_mismatch"
        and "model.temperature" in mismatch.message
    )
    _, keys = history.call(F.commit, F.CommitRequest(["s1"], None), 1, 102.0, (0.7, 1.0, 0))
    assert keys == ["s1#0"]  # a trainer at temperature 0.7 takes it
    greedy = one_turn("r2", "s2", [7])
    greedy.sampling = (0.0, 1.0, 0)  # greedy replies carry untempered logprobs: a temperature-1 trainer's
    history.call(record_turns, "s2", [greedy], False, 100.0)
    feedback(history, {"session_id": "s2", "reward": 1.0})
    assert history.call(F.commit, F.CommitRequest(["s2"], None), 1, 103.0, (1.0, 1.0, 0))[1] == ["s2#0"]


def two_turns(history: History, sid: str) -> None:
    """r1 sampled [7, 8]; r2 continues it (the user's [9]) with [10, 11]: response [7, 8 | 9 | 10, 11]."""
    history.call(record_turns, sid, [one_turn("r1", sid, [7, 8])], False, 100.0)
    second = one_turn("r2", sid, [10, 11], parent="r1/0")
    second.prompt_ids = np.array([5, 6, 7, 8, 9], dtype=np.int64)
    history.call(record_turns, sid, [second], False, 101.0)


def test_per_turn_feedback_is_idempotent_and_reaches_each_turn_s_tokens(history: History) -> None:
    two_turns(history, "mt")
    assert feedback(history, {"response_id": "r1", "reward": 0.5})["rewarded"] == ["r1"]
    assert feedback(history, {"response_id": "r2", "reward": 1.0, "task_id": "t"})["rewarded"] == ["r2"]
    assert feedback(history, {"response_id": "r1", "reward": 0.5})["unchanged"] == ["r1"]  # a retry
    conflict = error(feedback, history, {"msg_ids": ["r2"], "reward": 0.0})
    assert conflict.status == 409 and conflict.param == "reward"
    _, keys = history.call(F.commit, F.CommitRequest(["mt"], None), 1, 102.0)
    [exp] = history.call(F.group_experiences, keys[0], "p")
    assert exp.token_level_rewards.tolist() == [0, 0.5, 0, 0, 1.0] and exp.reward == 1.5
    assert exp.action_mask.tolist() == [True, True, False, True, True]


def test_one_call_naming_every_turn_is_one_reward_at_the_end(history: History) -> None:
    two_turns(history, "ep")
    feedback(history, {"msg_ids": ["r1", "r2"], "reward": 1.0})  # Trinity's client
    _, keys = history.call(F.commit, F.CommitRequest(["ep"], None), 1, 102.0)
    [exp] = history.call(F.group_experiences, keys[0], "p")
    assert exp.token_level_rewards.tolist() == [0, 0, 0, 0, 1.0] and exp.reward == 1.0


def test_a_history_from_before_feedback_ids_is_upgraded_and_its_rewards_count_one_each(
    tmp_path: pathlib.Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = History(url)
    two_turns(old, "o")
    old.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # the table as an older proxy wrote it, with two rewards in it
        conn.exec_driver_sql("DROP TABLE response_rewards")
        conn.exec_driver_sql(
            "CREATE TABLE response_rewards (response_id VARCHAR PRIMARY KEY, session_id VARCHAR NOT NULL, reward FLOAT NOT NULL)"
        )
        conn.exec_driver_sql("INSERT INTO response_rewards VALUES ('r1', 'o', 0.5), ('r2', 'o', 1.0)")
    engine.dispose()
    store = History(url)
    try:
        _, keys = store.call(F.commit, F.CommitRequest(["o"], None), 1, 102.0)
        [exp] = store.call(F.group_experiences, keys[0], "p")
        assert exp.token_level_rewards.tolist() == [0, 0.5, 0, 0, 1.0] and exp.reward == 1.5
    finally:
        store.close()
