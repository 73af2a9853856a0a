"""Writing committed groups to the buffer over a real SQLite history: a commit's write and the
sweep's flush that both hold a group write it once and count it once; a commit waits for the write
of its own group, never for others'."""

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


async def test_a_commit_waits_for_its_own_group_only(tmp_path: pathlib.Path) -> None:
    history = History(f"sqlite:///{tmp_path / 'h.db'}")
    buffer = RecordingBuffer(held=(":slow#0:",))  # the buffer is slow to take group slow#0
    commits = Commits(history, buffer, buffer_name="exp", producer="p", group_size=1, ttl_s=60, chunk=64)
    try:
        for task in ("slow", "fast"):
            session(history, task, f"r-{task}")
            feedback(history, {"session_id": task, "reward": 1.0, "task_id": task})
        slow = asyncio.create_task(commits.commit({"session_id": "slow"}))
        await asyncio.sleep(0.2)
        fast = await asyncio.wait_for(commits.commit({"session_id": "fast"}), 5.0)
        assert fast["committed"][0]["group_state"] == "written" and not slow.done()
        assert await asyncio.wait_for(commits.write_groups([]), 1.0) == set()  # no group: no wait
        buffer.release.set()
        assert (await slow)["committed"][0]["group_state"] == "written"
        assert [key for _, key, _ in buffer.writes] == ["serve:p:fast#0:part0", "serve:p:slow#0:part0"]
    finally:
        history.close()
