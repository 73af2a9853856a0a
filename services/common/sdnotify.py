"""Dependency-free `sd_notify(3)`: tell systemd (Type=notify units) that a service is ready or stopping.

Why: deploy/systemd/trinity-grpc@.service is `Type=notify`, so `After=trinity-grpc@buffer.service` in
the synchronizer's unit waits until the buffer really serves, not merely until its process exists.
`systemd-python` has no wheels; the protocol is one datagram of `KEY=VALUE` lines on the AF_UNIX socket
named by $NOTIFY_SOCKET (a leading `@` means the Linux abstract namespace). Without $NOTIFY_SOCKET
(a terminal, `trinity run`, compose, Kubernetes) every call is a no-op returning False.
"""

from __future__ import annotations

import os
import socket

__all__ = ["notify", "ready", "status", "stopping", "watchdog_interval_s", "watchdog_ping"]


def _address(raw: str) -> str | bytes:
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    return raw


def notify(*fields: str, unset_environment: bool = False) -> bool:
    """Send `fields` (e.g. "READY=1") to systemd; True if a datagram was sent, False without $NOTIFY_SOCKET.

    Never raises: a failed notification must not take a healthy server down (systemd then times the
    start out and says so in the journal).
    """
    raw = os.environ.get("NOTIFY_SOCKET", "")
    if unset_environment:
        os.environ.pop("NOTIFY_SOCKET", None)
    if not raw or not fields or not (raw.startswith("/") or raw.startswith("@")):
        return False
    payload = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(_address(raw))
            sock.sendall(payload)
    except OSError:
        return False
    return True


def ready(message: str | None = None) -> bool:
    """READY=1 (+ STATUS=message): call once the server is bound and reports SERVING."""
    fields = ["READY=1"]
    if message:
        fields.append(f"STATUS={message}")
    return notify(*fields)


def stopping(message: str | None = None) -> bool:
    """STOPPING=1: call when a graceful shutdown begins (systemd shows `deactivating`)."""
    return notify("STOPPING=1", *([f"STATUS={message}"] if message else []))


def status(message: str) -> bool:
    """STATUS=message: free text shown by `systemctl status`."""
    return notify(f"STATUS={message}")


def watchdog_interval_s() -> float | None:
    """Seconds between required WATCHDOG=1 pings when the unit sets WatchdogSec= (None: no watchdog).

    Like sd_watchdog_enabled(3): only for the PID systemd named in $WATCHDOG_PID, if it named one.
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1_000_000


def watchdog_ping() -> bool:
    """WATCHDOG=1: ping at least every watchdog_interval_s() / 2 seconds."""
    return notify("WATCHDOG=1")
