"""services.common.sdnotify against real AF_UNIX datagram sockets, as systemd's $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid

import pytest

from services.common import sdnotify


def receive(sock: socket.socket) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            return messages


@pytest.fixture
def abstract_socket(monkeypatch):
    name = f"trinity-sdnotify-test-{uuid.uuid4().hex[:12]}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", f"@{name}")
        yield sock


def test_ready_status_and_stopping_arrive_as_systemd_expects(abstract_socket) -> None:
    assert sdnotify.ready("serving buffer on 0.0.0.0:50051")
    assert sdnotify.status("draining")
    assert sdnotify.stopping()
    assert receive(abstract_socket) == [
        "READY=1\nSTATUS=serving buffer on 0.0.0.0:50051",
        "STATUS=draining",
        "STOPPING=1",
    ]


def test_filesystem_socket_path(monkeypatch) -> None:
    # Short directory: AF_UNIX paths are limited to 107 bytes.
    with (
        tempfile.TemporaryDirectory(dir="/tmp") as tmp,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock,
    ):
        path = os.path.join(tmp, "notify")
        sock.bind(path)
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert sdnotify.ready()
        assert receive(sock) == ["READY=1"]


def test_without_notify_socket_every_call_is_a_no_op(monkeypatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False and sdnotify.stopping() is False and sdnotify.watchdog_ping() is False


def test_a_dead_socket_never_raises(monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", f"@trinity-nobody-listens-{uuid.uuid4().hex}")
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    assert sdnotify.ready() is False


def test_unset_environment_keeps_children_from_notifying(abstract_socket) -> None:
    assert sdnotify.notify("READY=1", unset_environment=True)
    assert "NOTIFY_SOCKET" not in os.environ
    assert sdnotify.notify("READY=1") is False
    assert receive(abstract_socket) == ["READY=1"]


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("5000000", None, 5.0),
        ("5000000", "self", 5.0),
        ("5000000", "1", None),
        ("0", None, None),
        (None, None, None),
    ],
)
def test_watchdog_interval(monkeypatch, usec, pid, expected) -> None:
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert sdnotify.watchdog_interval_s() == expected
