"""Children of `trinity run` stop in order when the runner dies (SIGKILL, OOM kill).

The runner stops its children in STOP_ORDER: the explorer first (no new data), then the trainer
(it finishes or abandons its step, acks or gives back its leases while the buffer is there), the
synchronizer, and the buffer last. A runner killed with SIGKILL cannot, and children that each
stopped on their own at once left in any order: the buffer went first and the trainer's last acks
failed. So each child watches the runner (getppid, every POLL_S) and, once it is gone, waits for
the siblings that stop before it to exit, then stops itself gracefully (SIGTERM to itself). The
siblings' PIDs are in a file the runner rewrites whenever it starts or stops a child
(write_siblings). A sibling that has not exited `shutdown_grace_s` + SIBLING_MARGIN_S after this
child began waiting for it is waited for no longer, so one hung service cannot keep the rest up.

The children run in their own sessions (a Ctrl-C reaches the runner, which stops them in order), so
without this they would keep serving and holding their ports; rerunning the same command continues
from the buffer's cursors and the latest checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

PARENT_ENV = "TRINITY_PARENT_PID"
SIBLINGS_ENV = "TRINITY_SIBLINGS_FILE"  # JSON {label: pid} of the runner's children
LABEL_ENV = "TRINITY_CHILD_LABEL"  # this child's label there ("explorer-bench" runs services.explorer)
STOP_ORDER = ("explorer-bench", "explorer", "trainer", "synchronizer", "buffer")
POLL_S = 0.05
SIBLING_MARGIN_S = 2.0


def write_siblings(path: str, pids: dict[str, int]) -> None:
    """Replace the siblings file atomically (a child may read it at any moment)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(pids, f)
    os.replace(tmp, path)


def read_siblings(path: str) -> dict[str, int]:
    try:
        with open(path, encoding="utf-8") as f:
            return {str(k): int(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie (its parent, the runner, is dead and cannot reap it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        pass
    try:  # no /proc (not Linux)
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def role(label: str) -> str:
    """A child's place in STOP_ORDER: an explorer replica (`explorer-2`, ...) stops with the explorer."""
    if (
        label not in STOP_ORDER
        and label.startswith("explorer-")
        and label.removeprefix("explorer-").isdigit()
    ):
        return "explorer"
    return label


def stop_order(labels: Iterable[str]) -> list[str]:
    """`labels` in the order the runner stops them (labels outside STOP_ORDER are left out)."""
    ranked = [label for label in labels if role(label) in STOP_ORDER]
    return sorted(ranked, key=lambda label: (STOP_ORDER.index(role(label)), label))


def stop_before(label: str, labels: Iterable[str] = STOP_ORDER) -> tuple[str, ...]:
    """Those of `labels` that stop before `label` (none for a label outside STOP_ORDER)."""
    if role(label) not in STOP_ORDER:
        return ()
    rank = STOP_ORDER.index(role(label))
    return tuple(other for other in stop_order(labels) if STOP_ORDER.index(role(other)) < rank)


def wait_for_siblings(label: str, siblings: dict[str, int], grace_s: float) -> dict[str, float]:
    """Wait until the siblings that stop before `label` have exited; returns the seconds waited
    for each (each bounded by grace_s + SIBLING_MARGIN_S)."""
    waited: dict[str, float] = {}
    for name in stop_before(label, siblings):
        pid = siblings.get(name)
        if not pid or pid == os.getpid():
            continue
        start = time.monotonic()
        while alive(pid) and time.monotonic() - start < grace_s + SIBLING_MARGIN_S:
            time.sleep(POLL_S)
        waited[name] = round(time.monotonic() - start, 3)
    return waited


def watch_parent(service: str, grace_s: float, note: Callable[[str, dict[str, Any]], None]) -> None:
    """When started by `trinity run` ($TRINITY_PARENT_PID set): once that process is gone, wait for
    the siblings that stop first and SIGTERM this process. `note(event, fields)` reports both
    moments (the caller moves its output off the dead runner's pipe and logs)."""
    expected = os.environ.get(PARENT_ENV)
    if not expected or not expected.isdigit():
        return
    label = os.environ.get(LABEL_ENV) or service
    siblings_file = os.environ.get(SIBLINGS_ENV, "")

    def watch() -> None:
        while os.getppid() == int(expected):
            time.sleep(POLL_S)
        siblings = read_siblings(siblings_file) if siblings_file else {}
        with contextlib.suppress(Exception):  # stopping matters more than a log line
            note(
                "parent_gone",
                {"label": label, "stops_after": [n for n in stop_before(label) if n in siblings]},
            )
        waited = wait_for_siblings(label, siblings, grace_s)
        with contextlib.suppress(Exception):
            note("stopping_after_siblings", {"label": label, "waited_s": waited})
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
