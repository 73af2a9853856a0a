"""Serve mode under load with crashes, a short benchmarks/serve_load.py run: 16 agents of two-turn
sessions for 40 s against a real serve + train pair (`trinity run` in mode serve, a mode-train
trainer beside it) while the proxy, the buffer and the trainer are each SIGKILLed once. Agents
see only retryable errors; every acknowledged commit is in the buffer exactly once, as the
responses its agent got; summary.json's counters add up; the trainer trained and the proxy served
its new versions."""

from __future__ import annotations

import asyncio
import pathlib
from collections import Counter

import pytest

from benchmarks.lib.serve_load_audit import buffer_rows
from benchmarks.serve_load import load_run, parse

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
def test_load_with_a_sigkill_of_proxy_buffer_and_trainer_loses_and_doubles_nothing(
    tmp_path: pathlib.Path,
) -> None:
    args = parse(["--sessions", "16", "--minutes", "0.67", "--rounds", "0", "--kill", "proxy,buffer,trainer"])
    result = asyncio.run(load_run(tmp_path, args))
    config = result["config"]
    assert result["problems"] == [], result
    assert config["failures"] == 0 and sum(config["retries"].values()) > 0  # the kills were seen, and retried
    assert set(config["recovery_s"]) == {"proxy", "buffer", "trainer"} and config["trainer_starts"] == 2
    run_log = (tmp_path / "run.log").read_text()
    for child in ("explorer", "buffer"):
        assert f"{child} exited with code -9; restarting it" in run_log
    # the audit's facts, checked here again from the buffer file itself
    rows = buffer_rows(next(tmp_path.glob("runs/*/*/buffer/exp.sqlite")))
    sessions = Counter(r.session_id for r in rows)
    assert len(rows) == config["sessions_acknowledged"] > 100 and max(sessions.values()) == 1
    assert all(len(r.response_ids) == 2 for r in rows)  # both turns of a session in one experience
    counts = config["experiences"]
    assert counts["written"] == len(rows) == config["proxy_counters"]["experiences_written"]
    assert counts["written"] == counts["trained"] + counts["buffered"] + sum(counts["dropped"].values())
    assert counts["trained"] > 0 and config["load"]["versions_served"]["last"] > 0
