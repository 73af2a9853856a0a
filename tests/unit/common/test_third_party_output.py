"""Benign third-party output goes to a service's log file, not to `trinity run`'s console.

A service process (configure_logging) turns the deprecation / user warnings that installed libraries
raise into `third_party_output` records, with one `third_party_output_is_benign` line per process
saying why; the runner (`should_forward`) keeps those off the console and shows everything else:
our own warnings, other categories, errors. vLLM's reload warnings: tests/vllm/test_reload_warnings.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from services.cli.progress import should_forward
from services.common.logging import QUIET_EVENTS, THIRD_PARTY_EVENT, THIRD_PARTY_WHY_EVENT
from tests.conftest import REPO

LIBRARY = "/opt/venv/lib/python3.11/site-packages/transformers/utils/generic.py"
CHILD = f"""
import logging, warnings
from services.common.logging import configure_logging, get_logger
configure_logging("explorer")
warnings.simplefilter("always")
lib = {LIBRARY!r}
warnings.warn_explicit("`past_key_values` is deprecated", FutureWarning, lib, 1036)
warnings.warn_explicit("`foo` is deprecated", DeprecationWarning, lib, 7)
warnings.warn_explicit("ambiguous sampling settings", UserWarning, lib, 9)
warnings.warn_explicit("overflow in exp", RuntimeWarning, lib, 11)  # not a quiet category
warnings.warn_explicit("ours is deprecated", FutureWarning, {str(REPO / "services" / "x.py")!r}, 3)
logging.getLogger("transformers.modeling_utils").error("a third-party error")
get_logger("x").info("served")
"""


def run_child() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def records(lines: list[str]) -> list[dict]:
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_library_deprecation_and_user_warnings_are_logged_once_explained() -> None:
    logged = records(run_child())
    quiet = [r for r in logged if r["event"] == THIRD_PARTY_EVENT]
    assert [(r["category"], r["message"]) for r in quiet] == [
        ("FutureWarning", "`past_key_values` is deprecated"),
        ("DeprecationWarning", "`foo` is deprecated"),
        ("UserWarning", "ambiguous sampling settings"),
    ]
    assert quiet[0]["location"] == f"{LIBRARY}:1036" and quiet[0]["service"] == "explorer"
    [why] = [r for r in logged if r["event"] == THIRD_PARTY_WHY_EVENT]  # once per process
    assert why["kind"] == "warning" and "change nothing this run computes" in why["why"]
    assert logged.index(why) < logged.index(quiet[0])


def test_the_console_shows_everything_else() -> None:
    lines = run_child()
    console = [line for line in lines if should_forward(line, verbose=False)]
    text = "\n".join(console)
    assert "deprecated" not in text.replace("ours is deprecated", "")  # only our own deprecation shows
    assert "ambiguous sampling settings" not in text
    assert "RuntimeWarning: overflow in exp" in text  # another category, from a library
    assert "x.py:3: FutureWarning: ours is deprecated" in text  # ours, whatever the category
    assert "a third-party error" in text  # errors are never filtered
    assert any('"served"' in line for line in console)
    # --verbose shows the quiet records too, and the log file (every line) keeps them all
    assert [line for line in lines if should_forward(line, verbose=True)] == lines
    assert sum(THIRD_PARTY_EVENT in line for line in lines) >= 3


def test_the_quiet_events_are_the_two_third_party_records() -> None:
    assert QUIET_EVENTS == {THIRD_PARTY_EVENT, THIRD_PARTY_WHY_EVENT}
