"""cli/memory_watch.py against real processes: a service's descendants count in its total, the peak
and its split are kept, a continued stage keeps the higher of its runs, and the summary line."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from services.cli.memory_watch import MemoryWatch, descendants, format_memory, rss_mb, run_watched

# a child that starts a grandchild holding ~200 MiB, then waits to be killed
PARENT = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c",
    "import sys, time; block = bytearray(200 * 2**20); print('ready', flush=True); time.sleep(600)"],
    stdout=sys.stdout)
time.sleep(600)
"""


@pytest.fixture
def parent():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    for pid in descendants(proc.pid)[1:]:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    proc.kill()
    proc.wait()


def test_a_services_descendants_count_in_its_total(parent: subprocess.Popen) -> None:
    tree = descendants(parent.pid)
    assert tree[0] == parent.pid and len(tree) == 2
    assert rss_mb(tree[1]) > 190  # the grandchild's block, touched by bytearray's zeroing
    watch = MemoryWatch(lambda: {"explorer": parent.pid})
    total = watch.sample()
    assert total >= rss_mb(parent.pid) + 190 and watch.peak == total
    assert list(watch.at_peak) == ["explorer"]


def test_the_peak_and_its_split_are_kept_and_a_gone_process_counts_zero(parent: subprocess.Popen) -> None:
    pids = {"explorer": parent.pid}
    watch = MemoryWatch(lambda: dict(pids), interval=0.01)
    high = watch.sample()
    pids["explorer"] = 2**22 + 12345  # no such process (above the default pid_max)
    assert watch.sample() == 0.0 and watch.peak == high and watch.samples == 2
    out = watch.result()
    assert out is not None and out["peak_total_rss_mb"] == round(high, 1) and out["samples"] == 2
    assert out["at_peak"] == {"explorer": round(high, 1)} and out["interval_s"] == 0.01


def test_a_continued_stage_keeps_the_higher_peak() -> None:
    watch = MemoryWatch(lambda: {})
    assert watch.result() is None and watch.result({"peak_total_rss_mb": 5.0}) == {"peak_total_rss_mb": 5.0}
    watch.samples, watch.peak, watch.at_peak = 3, 100.0, {"trainer": 100.0}
    before = {"peak_total_rss_mb": 200.0, "at_peak": {"trainer": 200.0}, "interval_s": 0.5, "samples": 7}
    assert watch.result(before) == {**before, "samples": 10}
    lower = {**before, "peak_total_rss_mb": 50.0}
    assert watch.result(lower)["peak_total_rss_mb"] == 100.0  # type: ignore[index]


def test_run_watched_records_the_memory_of_the_runners_children(parent: subprocess.Popen) -> None:
    class Runner:
        children = {"trainer": type("C", (), {"proc": parent})()}

        async def run(self, entry: dict, save) -> int:  # noqa: ANN001
            await asyncio.sleep(0.3)
            return 0

    entry: dict = {}
    saved = []
    assert asyncio.run(run_watched(Runner(), entry, lambda: saved.append(1))) == 0
    assert entry["memory"]["peak_total_rss_mb"] > 190 and set(entry["memory"]["at_peak"]) == {"trainer"}
    assert saved  # the summary is written with it


def test_format_memory() -> None:
    memory = {
        "peak_total_rss_mb": 7372.8,
        "at_peak": {"explorer": 3072.0, "trainer": 4096.0},
        "interval_s": 0.5,
    }
    assert format_memory("grpo", memory) == [
        "grpo: all services at once, peak 7.2 GiB (explorer 3.0, trainer 4.0; resident sets sampled "
        "every 0.5 s, shared pages counted in each)"
    ]
    assert format_memory("grpo", None) == []
