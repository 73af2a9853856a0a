"""A child of a dead `trinity run` keeps logging: its broken stderr pipe gives way to its log file."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from tests.conftest import REPO

CHILD = """
import sys
from services.common.logging import configure_logging, get_logger
configure_logging("svc")
get_logger("x").info("before")
sys.stdin.read()  # until the parent has closed its end of the stderr pipe
get_logger("x").info("after_the_runner", n=1)
get_logger("x").info("and_the_next")
"""


def test_a_log_line_to_a_broken_pipe_lands_in_the_log_file(tmp_path: pathlib.Path) -> None:
    log_file = tmp_path / "svc.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "TRINITY_LOG_FILE": str(log_file)},
    )
    assert proc.stderr is not None and proc.stdin is not None
    first = json.loads(proc.stderr.readline())
    assert first["event"] == "before" and not log_file.exists()  # the pipe is used while it works
    proc.stderr.close()  # the runner died
    proc.stdin.close()
    assert proc.wait(60) == 0  # logging raised nothing
    events = [json.loads(line)["event"] for line in log_file.read_text().splitlines()]
    assert events == ["after_the_runner", "and_the_next"]
