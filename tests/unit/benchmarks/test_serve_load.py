"""benchmarks/serve_load.py pure helpers: how sessions are handed out (whole GRPO groups), the
reward, which client errors are retried, the audit's verdicts on hand-made buffers, percentiles.

No pair is started here (that is the benchmark; tests/integration/test_serve_load.py runs it)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from benchmarks import serve_load
from benchmarks.lib.serve_load_agents import Tasks, retry_kind, reward_of
from benchmarks.lib.serve_load_audit import Row, audit


def test_sessions_come_in_whole_groups_and_a_started_task_is_finished_after_the_deadline() -> None:
    tasks = Tasks(group=3, seed=0, prefix="l-")
    tasks.deadline = time.monotonic() + 60
    first = [tasks.next() for _ in range(4)]
    assert [(t, s) for t, s, _ in first] == [
        ("l-q0", "l-q0-r0"),
        ("l-q0", "l-q0-r1"),
        ("l-q0", "l-q0-r2"),
        ("l-q1", "l-q1-r0"),
    ]
    assert len({q for _, _, q in first[:3]}) == 1  # one question per task
    tasks.deadline = 0.0  # time is up: q1's two other sessions still come, then nothing
    assert [tasks.next()[1] for _ in range(2)] == ["l-q1-r1", "l-q1-r2"]
    assert tasks.next() is None


def test_the_reward_is_the_share_of_digits() -> None:
    assert reward_of("17") == 1.0 and reward_of("a1b2") == 0.5 and reward_of("") == 0.0


def test_connection_errors_and_timeouts_are_retried_and_nothing_else() -> None:
    assert retry_kind(aiohttp.ServerDisconnectedError()) == "disconnected"
    assert retry_kind(aiohttp.ClientOSError(104, "Connection reset by peer")) == "connection_reset"
    assert retry_kind(asyncio.TimeoutError()) == "timeout"
    assert retry_kind(aiohttp.InvalidURL("x")) is None


STAGE = {
    "experiences": {"written": 2, "trained": 1, "buffered": 1, "dropped": {}},
    "serve": {"experiences_written": 2, "experiences_committed": 2},
}


def test_a_clean_run_has_no_problems() -> None:
    rows = [Row("a", ("r1", "r2"), "q0#0", 0), Row("b", ("r3", "r4"), "q0#0", 1)]
    problems, figures = audit({"a": ["r1", "r2"], "b": ["r3", "r4"]}, rows, STAGE, [])
    assert problems == [] and figures["buffer_rows"] == 2 and figures["versions_in_buffer"] == 2


def test_doubles_losses_strangers_and_other_responses_are_each_named() -> None:
    rows = [
        Row("a", ("r1", "r2"), "q0#0", 0),
        Row("a", ("r1", "r2"), "q0#0", 0),  # written twice
        Row("c", ("r5", "r6"), "q0#0", 0),  # never acknowledged
        Row("d", ("r7", "x"), "q1#0", 0),  # not the response the agent got (a second sample)
    ]
    acked = {"a": ["r1", "r2"], "b": ["r3", "r4"], "d": ["r7", "r8"]}
    problems, _ = audit(acked, rows, STAGE, ["/commit: HTTP 500"])
    text = "\n".join(problems)
    assert "request failed: /commit: HTTP 500" in text
    assert "1 sessions in the buffer more than once: ['a']" in text
    assert "1 sessions committed (acknowledged) but not in the buffer: ['b']" in text
    assert "1 sessions in the buffer but never acknowledged: ['c']" in text
    assert "1 sessions in the buffer with other responses than its agent got: ['d']" in text
    assert "buffer written is 2, but the buffer holds 4 rows" in text


def test_counters_that_do_not_add_up_are_a_problem() -> None:
    rows = [Row("a", ("r1", "r2"), "q0#0", 0), Row("b", ("r3", "r4"), "q0#0", 0)]
    acked = {"a": ["r1", "r2"], "b": ["r3", "r4"]}
    stage = {
        "experiences": {"written": 2, "trained": 2, "buffered": 1, "dropped": {"flat": 1}},
        "serve": {"experiences_written": 3, "experiences_committed": 2, "sessions_expired": 1},
    }
    problems, _ = audit(acked, rows, stage, [])
    assert problems == [
        "written 2 != trained + buffered + dropped = 4: " + str(stage["experiences"]),
        "proxy experiences_written is 3, but the buffer holds 2 rows",
        "the proxy counted 1 sessions_expired (agents commit every session, whole)",
    ]
    assert audit(acked, rows, {}, [])[0] == ["summary.json has no counters for the stage: []"]


def test_percentiles_pick_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert serve_load.percentile(values, 0.5) == 51.0 and serve_load.percentile(values, 0.99) == 99.0
    assert serve_load.quantiles([]) == {"n": 0, "p50_s": None, "p99_s": None}


def test_an_unknown_service_to_kill_is_refused_by_name(tmp_path) -> None:
    args = serve_load.parse(["--kill", "proxy,explorer"])
    with pytest.raises(SystemExit, match="'explorer' is not one of proxy, buffer, trainer"):
        asyncio.run(serve_load.load_run(tmp_path, args))
