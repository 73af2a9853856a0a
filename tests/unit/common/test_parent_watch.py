"""The stop order children of a dead `trinity run` follow (services/common/parent_watch.py), with
real processes standing in for the siblings."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from services.common import parent_watch
from services.common.parent_watch import (
    alive,
    read_siblings,
    stop_before,
    stop_order,
    wait_for_siblings,
    write_siblings,
)


def test_each_service_stops_after_those_before_it_in_the_runners_order() -> None:
    assert stop_before("explorer") == ("explorer-bench",)
    assert stop_before("trainer") == ("explorer-bench", "explorer")
    assert stop_before("buffer") == ("explorer-bench", "explorer", "trainer", "synchronizer")
    assert stop_before("something-else") == ()


def test_siblings_file_round_trip_and_unreadable_file(tmp_path) -> None:
    path = str(tmp_path / "children.json")
    assert read_siblings(path) == {}
    write_siblings(path, {"buffer": 11, "trainer": 12})
    assert read_siblings(path) == {"buffer": 11, "trainer": 12}
    (tmp_path / "children.json").write_text("[1, 2")
    assert read_siblings(path) == {}


def test_waits_for_a_sibling_to_exit_and_no_longer_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parent_watch, "SIBLING_MARGIN_S", 0.5)
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        waited = wait_for_siblings("trainer", {"explorer": quick.pid, "buffer": hung.pid}, grace_s=5)
        assert 0 < waited["explorer"] < 5 and "buffer" not in waited  # the buffer stops after
        quick.wait(5)
        started = time.monotonic()
        waited = wait_for_siblings("buffer", {"synchronizer": hung.pid}, grace_s=0.5)
        assert 0.9 < time.monotonic() - started < 5 and alive(hung.pid)  # gave up on the hung one
    finally:
        hung.kill()
        hung.wait(5)
    assert not alive(hung.pid) and not alive(quick.pid)


def test_explorer_replicas_stop_with_the_explorer() -> None:
    labels = ["buffer", "explorer-2", "trainer", "explorer", "synchronizer", "explorer-bench"]
    assert stop_order(labels) == [
        "explorer-bench",
        "explorer",
        "explorer-2",
        "trainer",
        "synchronizer",
        "buffer",
    ]
    assert stop_before("trainer", labels) == ("explorer-bench", "explorer", "explorer-2")
    assert stop_before("explorer-2", labels) == ("explorer-bench",)
    assert stop_order(["explorer-x", "buffer"]) == ["buffer"]  # not a replica label
