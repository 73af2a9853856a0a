"""A service process's stop never outlasts `services.shutdown_grace_s` (+ HARD_STOP_MARGIN_S).

A graceful stop drains calls and runs hooks within the grace, and the trainer abandons a step that
cannot end in time, but some work cannot be interrupted from the event loop: a `generate` call or a
checkpoint write in a worker thread, which `asyncio.run` waits for before the process can exit. A
watchdog armed at the first stop request ends such a process when the grace (plus a margin for the
interpreter's exit) is over, with a log line saying so. Nothing is lost by it: acknowledged writes
are committed before their reply, checkpoints are written to a temp dir and renamed, leases not
acked go back. Only service processes enable it (services.common.entry), never a test's event loop.
"""

from __future__ import annotations

import os
import sys
import threading

from services.common.logging import get_logger

log = get_logger("hard_stop")
HARD_STOP_MARGIN_S = 1.0  # the interpreter's own exit takes ~0.3 s after the last log line

_state = {"enabled": False, "armed": False}


def enable() -> None:
    """Let arm() end this process: called by a service's entry point only."""
    _state["enabled"] = True


def arm(service: str, grace_s: float) -> None:
    """Start the watchdog of a stop just requested (once per process; a no-op unless enabled)."""
    if not _state["enabled"] or _state["armed"]:
        return
    _state["armed"] = True
    timer = threading.Timer(grace_s + HARD_STOP_MARGIN_S, _expire, args=(service, grace_s))
    timer.daemon = True
    timer.start()


def _expire(service: str, grace_s: float) -> None:
    log.warning(
        "stop_overran_grace",
        service=service,
        grace_s=grace_s,
        hint="work still running in a thread was cut off; raise services.shutdown_grace_s to let it finish",
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
