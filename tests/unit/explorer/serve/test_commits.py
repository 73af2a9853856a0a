"""Writing committed groups to the buffer over a real SQLite history: a commit's write and the
sweep's flush that both hold a group write it once and count it once; a commit that completes no
group answers without waiting for the writes of others."""

from __future__ import annotations

import asyncio
import pathlib

from services.explorer.serve import feedback as F
from services.explorer.serve.commits import Commits
from services.explorer.serve.history import History
from tests.fakes.serve import RecordingBuffer
from tests.unit.explorer.serve.test_feedback import feedback, session


async def test_a_group_held_by_a_commit_and_the_sweep_is_written_and_counted_once(
    tmp_path: pathlib.Path,
) -> None:
    history = History(f"sqlite:///{tmp_path / 'h.db'}")
    buffer = RecordingBuffer()
    commits = Commits(history, buffer, buffer_name="exp", producer="p", group_size=2, ttl_s=60, chunk=64)
    try:
        for i in range(2):
            session(history, f"s{i}", f"r{i}")
            feedback(history, {"session_id": f"s{i}", "reward": float(i), "task_id": "t"})
        _, keys = history.call(F.commit, F.CommitRequest(["s0", "s1"], None), 2, 101.0)
        assert keys == ["t#0"]
        # the commit's own write of t#0 runs while a sweep finds t#0 pending and flushes it too
        written, flushed = await asyncio.gather(commits.write_groups(keys), commits.flush())
        assert written == {"t#0"} and flushed == {"t#0"}
        assert buffer.writes == [("exp", "serve:p:t#0:part0", 2)]
        counters = history.call(F.stats)["counters"]
        assert counters["groups_written"] == 1 and counters["experiences_written"] == 2
        history.call(F.mark_written, "t#0")  # a late mark of a written group counts nothing
        assert history.call(F.stats)["counters"]["experiences_written"] == 2
    finally:
        history.close()


async def test_a_commit_that_completes_no_group_does_not_wait_for_other_groups_writes(
    tmp_path: pathlib.Path,
) -> None:
    history = History(f"sqlite:///{tmp_path / 'h.db'}")
    commits = Commits(
        history, RecordingBuffer(), buffer_name="exp", producer="p", group_size=2, ttl_s=60, chunk=64
    )
    try:
        async with commits._write_lock:  # a slow group write (the buffer restarting) holds the lock
            assert await asyncio.wait_for(commits.write_groups([]), 1.0) == set()
    finally:
        history.close()
