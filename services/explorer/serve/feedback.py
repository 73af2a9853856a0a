"""/feedback and /commit: the rules, each applied in one transaction of the history (history.py).

Feedback (Trinity's body: `reward`, `msg_ids` = response ids, `task_id`; or `session_id` for a
whole session) is checked whole before anything changes: an unknown id is 404, an expired session
410, a different reward for something already rewarded (or a change to a committed session) 409,
and the same feedback again changes nothing (at-least-once clients are safe).

Commit closes sessions: each chain of a session becomes an experience (chains.py) whose turns
carry their responses' rewards (each feedback call once per chain) and whose end carries the
session's; chains without any are dropped and counted.
A session is filed under its task id (the commit's, else its feedback's, else its own id); every
`group_size` (algorithm.repeat_times) sessions of one task id make a group, written to the buffer
together so that group advantages (GRPO) compare the rollouts of one task. A commit is acknowledged
once it is in the history: a group is written then, or by the retry loop if the buffer is away.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from services.common.experience import Experience
from services.explorer.serve import history as H
from services.explorer.serve.chains import ResponseReward, session_experiences
from services.explorer.serve.protocol import SESSION_ID, ApiError


@dataclass
class FeedbackRequest:
    reward: float
    response_ids: list[str]
    session_id: str | None
    task_id: str | None


@dataclass
class CommitRequest:
    session_ids: list[str] | None
    """None: every open session with a reward (Trinity's commit)."""
    task_id: str | None


def _string(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not SESSION_ID.match(value)):
        raise ApiError(400, f"{key} must be 1-128 characters of letters, digits and . _ : @ -", param=key)
    return value


def _ids(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ApiError(400, f"{key} must be a non-empty list of ids", param=key)
    return list(dict.fromkeys(value))


def _body(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key in body:
        if key not in allowed:
            raise ApiError(400, f"Unrecognized request argument supplied: {key}", param=key)
    return body


def parse_feedback(raw: Any) -> FeedbackRequest:
    body = _body(raw, {"reward", "msg_ids", "response_id", "session_id", "task_id", "run_id"})
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ApiError(400, f"reward must be a finite number, got {reward!r}", param="reward")
    ids = _ids(body, "msg_ids")
    single = body.get("response_id")
    if single is not None:
        if not isinstance(single, str) or not single:
            raise ApiError(400, "response_id must be an id string", param="response_id")
        ids = list(dict.fromkeys([*ids, single]))
    session = _string(body, "session_id")
    if bool(ids) == (session is not None):
        raise ApiError(400, "give either msg_ids / response_id (responses) or session_id (a whole session)")
    return FeedbackRequest(float(reward), ids, session, _string(body, "task_id"))


def parse_commit(raw: Any) -> CommitRequest:
    body = _body(raw if raw is not None else {}, {"session_id", "session_ids", "task_id"})
    ids = _ids(body, "session_ids")
    single = _string(body, "session_id")
    if single is not None:
        ids = list(dict.fromkeys([*ids, single]))
    for sid in ids:
        if not SESSION_ID.match(sid):
            raise ApiError(400, f"session id {sid!r} is not a valid id", param="session_ids")
    return CommitRequest(ids or None, _string(body, "task_id"))


# --- feedback --------------------------------------------------------------------------------------


def _live_session(conn: sa.Connection, sid: str, what: str) -> Any:
    row = H.session_row(conn, sid)
    if row is None:
        raise ApiError(404, f"{what}: unknown session {sid!r}", param="session_id", code="session_not_found")
    if row.state == "expired":
        raise ApiError(410, f"{what}: session {sid!r} expired without a commit", param="session_id")
    return row


def _check_task(row: Any, task_id: str | None) -> None:
    if task_id is not None and row.task_id is not None and row.task_id != task_id:
        raise ApiError(
            409,
            f"session {row.session_id!r} is filed under task_id {row.task_id!r}, not {task_id!r}",
            param="task_id",
        )


def apply_feedback(conn: sa.Connection, req: FeedbackRequest, now: float) -> dict[str, Any]:
    """Check every target, then record the reward; returns what changed and what already was."""
    changes: list[tuple[str, str]] = []  # (kind, id) to write
    unchanged: list[str] = []
    sessions: dict[str, Any] = {}
    for rid in req.response_ids:
        found = conn.execute(sa.select(H.TURNS.c.session_id).where(H.TURNS.c.response_id == rid)).first()
        if found is None:
            raise ApiError(404, f"unknown response id {rid!r}", param="msg_ids", code="response_not_found")
        row = sessions.setdefault(found.session_id, _live_session(conn, found.session_id, rid))
        old = conn.execute(sa.select(H.REWARDS.c.reward).where(H.REWARDS.c.response_id == rid)).scalar()
        _check_change(rid, old, req.reward, row)
        (unchanged.append(rid) if old is not None else changes.append(("response", rid)))
    if req.session_id is not None:
        row = sessions.setdefault(req.session_id, _live_session(conn, req.session_id, "feedback"))
        _check_change(f"session {req.session_id}", row.reward, req.reward, row)
        (
            unchanged.append(req.session_id)
            if row.reward is not None
            else changes.append(("session", req.session_id))
        )
    for row in sessions.values():
        _check_task(row, req.task_id)
    call = uuid.uuid4().hex  # the responses this call rewards count once per chain (chains.turn_rewards)
    for kind, target in changes:
        if kind == "response":
            sid = conn.execute(
                sa.select(H.TURNS.c.session_id).where(H.TURNS.c.response_id == target)
            ).scalar()
            conn.execute(
                sa.insert(H.REWARDS).values(
                    response_id=target, session_id=sid, reward=req.reward, feedback_id=call
                )
            )
        else:
            conn.execute(
                sa.update(H.SESSIONS).where(H.SESSIONS.c.session_id == target).values(reward=req.reward)
            )
    for sid, row in sessions.items():
        values: dict[str, Any] = {"last_active": now}
        if req.task_id is not None and row.task_id is None:
            values["task_id"] = req.task_id
        conn.execute(sa.update(H.SESSIONS).where(H.SESSIONS.c.session_id == sid).values(**values))
    H.bump(conn, "feedback_recorded", len(changes))
    H.bump(conn, "feedback_repeated", len(unchanged))
    return {
        "status": "ok",
        "rewarded": [t for _, t in changes],
        "unchanged": unchanged,
        "sessions": sorted(sessions),
    }


def _check_change(target: str, old: float | None, new: float, row: Any) -> None:
    if old is not None and old != new:
        raise ApiError(
            409, f"{target} already has reward {old}; refusing the different reward {new}", param="reward"
        )
    if old is None and row.state == "committed":
        raise ApiError(
            409, f"session {row.session_id!r} is committed; a reward can no longer change", param="reward"
        )


# --- commit ----------------------------------------------------------------------------------------


def _rewards(conn: sa.Connection, sid: str) -> dict[str, ResponseReward]:
    rows = conn.execute(sa.select(H.REWARDS).where(H.REWARDS.c.session_id == sid))
    # a reward recorded before feedback ids existed counts as a call of its own
    return {r.response_id: ResponseReward(float(r.reward), r.feedback_id or r.response_id) for r in rows}


def _summary(row: Any) -> dict[str, Any]:
    return {
        "session_id": row.session_id,
        "task_id": row.task_id,
        "experiences": row.experiences,
        "unrewarded": row.unrewarded,
        "splits": row.splits,
        "group": row.group_key,
    }


def logprob_sampling(temperature: float, top_p: float, top_k: int) -> tuple[float, float, int]:
    """The distribution logprobs are taken under: greedy (temperature 0) reports untempered ones."""
    return (temperature if temperature > 0 else 1.0, top_p, max(top_k, 0))


def _check_sampling(sid: str, turns: list[Any], trained: tuple[float, float, int]) -> None:
    for turn in turns:
        got = logprob_sampling(*turn.sampling)
        if got != trained:
            raise ApiError(
                409,
                f"session {sid!r} was sampled with (temperature, top_p, top_k) = {got} but the trainer takes "
                f"logprobs under {trained} (model.temperature, model.top_p, model.top_k): its importance ratios "
                "would be wrong. Sample training sessions with those settings (the proxy's defaults), or set them "
                "in model:",
                param="temperature",
                code="sampling_mismatch",
            )


def commit(
    conn: sa.Connection,
    req: CommitRequest,
    group_size: int,
    now: float,
    trained: tuple[float, float, int] = (1.0, 1.0, 0),
) -> tuple[dict[str, Any], list[str]]:
    """Commit the sessions asked for (all rewarded open ones when none is named); returns the
    response body and the keys of the groups now complete (to write to the buffer). `trained`: the
    (temperature, top_p, top_k) the trainer computes logprobs under; every turn must match it."""
    if req.session_ids is None:
        rewarded = sa.select(H.REWARDS.c.session_id)
        ids = [
            r.session_id
            for r in conn.execute(
                sa.select(H.SESSIONS.c.session_id)
                .where(H.SESSIONS.c.state == "open")
                .where(sa.or_(H.SESSIONS.c.reward.is_not(None), H.SESSIONS.c.session_id.in_(rewarded)))
                .order_by(H.SESSIONS.c.created)
            )
        ]
    else:
        ids = req.session_ids
    rows = [_live_session(conn, sid, "commit") for sid in ids]
    for row in rows:
        _check_task(row, req.task_id)
    fresh = []
    for row in rows:
        if row.state == "committed":
            continue
        turns = H.load_turns(conn, row.session_id)
        _check_sampling(row.session_id, turns, trained)
        exps, unrewarded = session_experiences(turns, _rewards(conn, row.session_id), row.reward)
        if not exps:
            raise ApiError(
                409,
                f"session {row.session_id!r} has no reward: POST /feedback for it (or its responses) first",
                param="session_id",
                code="no_reward",
            )
        fresh.append((row, len(exps), unrewarded))
    tasks = set()
    for row, count, unrewarded in fresh:
        task = req.task_id or row.task_id or row.session_id
        tasks.add(task)
        conn.execute(
            sa.update(H.SESSIONS)
            .where(H.SESSIONS.c.session_id == row.session_id)
            .values(
                state="committed", task_id=task, committed_at=now, experiences=count, unrewarded=unrewarded
            )
        )
        H.bump(conn, "sessions_committed")
        H.bump(conn, "experiences_committed", count)
        H.bump(conn, "chains_unrewarded", unrewarded)
    keys = [key for task in sorted(tasks) for key in _form_groups(conn, task, group_size, now, partial=False)]
    done = [H.session_row(conn, sid) for sid in ids]
    return {"status": "ok", "committed": [_summary(r) for r in done]}, keys


def _form_groups(conn: sa.Connection, task: str, size: int, now: float, *, partial: bool) -> list[str]:
    """Groups of `size` committed sessions of `task` not yet grouped (and, with `partial`, one of
    whatever is left); returns their keys."""
    waiting = [
        r.session_id
        for r in conn.execute(
            sa.select(H.SESSIONS.c.session_id)
            .where(
                H.SESSIONS.c.task_id == task,
                H.SESSIONS.c.state == "committed",
                H.SESSIONS.c.group_key.is_(None),
            )
            .order_by(H.SESSIONS.c.committed_at, H.SESSIONS.c.session_id)
        )
    ]
    keys = []
    while len(waiting) >= size or (partial and waiting):
        members, waiting = waiting[:size], waiting[size:]
        made = conn.execute(sa.select(sa.func.count()).where(H.GROUPS.c.task_id == task)).scalar() or 0
        key = f"{task}#{made}"
        rows = sum(H.session_row(conn, sid).experiences for sid in members)
        conn.execute(
            sa.insert(H.GROUPS).values(
                group_key=key, task_id=task, state="pending", sessions=len(members), rows=rows, created=now
            )
        )
        conn.execute(sa.update(H.SESSIONS).where(H.SESSIONS.c.session_id.in_(members)).values(group_key=key))
        if len(members) < size:
            H.bump(conn, "partial_groups")
        keys.append(key)
    return keys


def group_experiences(conn: sa.Connection, key: str, producer: str) -> list[Experience]:
    """The rows of group `key`, rebuilt from its sessions' turns (the same rows every time)."""
    members = conn.execute(
        sa.select(H.SESSIONS)
        .where(H.SESSIONS.c.group_key == key)
        .order_by(H.SESSIONS.c.committed_at, H.SESSIONS.c.session_id)
    ).all()
    out = []
    for run, row in enumerate(members):
        exps, _ = session_experiences(
            H.load_turns(conn, row.session_id), _rewards(conn, row.session_id), row.reward
        )
        for exp in exps:
            exp.task_id, exp.group_id, exp.run_id, exp.producer = row.task_id, key, run, producer
            exp.info["splits"] = row.splits
        out.extend(exps)
    return out


def group_written(conn: sa.Connection, key: str) -> bool:
    state = conn.execute(sa.select(H.GROUPS.c.state).where(H.GROUPS.c.group_key == key)).scalar()
    return state == "written"


def mark_written(conn: sa.Connection, key: str) -> None:
    """Mark a pending group written and count it (a group written already is counted already)."""
    pending = (H.GROUPS.c.group_key == key) & (H.GROUPS.c.state == "pending")
    if conn.execute(sa.update(H.GROUPS).where(pending).values(state="written")).rowcount == 0:
        return
    H.bump(conn, "groups_written")
    rows = conn.execute(sa.select(H.GROUPS.c.rows).where(H.GROUPS.c.group_key == key)).scalar() or 0
    H.bump(conn, "experiences_written", int(rows))


def pending_groups(conn: sa.Connection) -> list[str]:
    rows = conn.execute(
        sa.select(H.GROUPS.c.group_key).where(H.GROUPS.c.state == "pending").order_by(H.GROUPS.c.created)
    )
    return [r.group_key for r in rows]


def expire(conn: sa.Connection, now: float, ttl: float, group_size: int) -> tuple[int, list[str]]:
    """Sessions idle past the TTL without a commit are dropped (counted); committed sessions that
    waited past it for the rest of their group are written as a smaller group. Returns (sessions
    dropped, group keys to write)."""
    stale = [
        r.session_id
        for r in conn.execute(
            sa.select(H.SESSIONS.c.session_id).where(
                H.SESSIONS.c.state == "open", H.SESSIONS.c.last_active < now - ttl
            )
        )
    ]
    if stale:
        turns = conn.execute(sa.select(sa.func.count()).where(H.TURNS.c.session_id.in_(stale))).scalar() or 0
        conn.execute(sa.update(H.SESSIONS).where(H.SESSIONS.c.session_id.in_(stale)).values(state="expired"))
        H.bump(conn, "sessions_expired", len(stale))
        H.bump(conn, "turns_expired", int(turns))
    waiting = conn.execute(
        sa.select(H.SESSIONS.c.task_id)
        .where(H.SESSIONS.c.state == "committed", H.SESSIONS.c.group_key.is_(None))
        .where(H.SESSIONS.c.committed_at < now - ttl)
        .distinct()
    ).all()
    keys = [k for r in waiting for k in _form_groups(conn, r.task_id, group_size, now, partial=True)]
    return len(stale), keys


def stats(conn: sa.Connection) -> dict[str, Any]:
    sessions = {
        r.state: int(r.n)
        for r in conn.execute(
            sa.select(H.SESSIONS.c.state, sa.func.count().label("n")).group_by(H.SESSIONS.c.state)
        )
    }
    groups = {
        r.state: int(r.n)
        for r in conn.execute(
            sa.select(H.GROUPS.c.state, sa.func.count().label("n")).group_by(H.GROUPS.c.state)
        )
    }
    return {"sessions": sessions, "groups": groups, "counters": H.counters(conn)}
