"""Start, watch and stop service processes (used by `trinity run` and the integration tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping

from services.common.health import wait_healthy

__all__ = ["free_port", "listening", "start_service", "stop_process", "wait_healthy"]


def free_port() -> int:
    """A TCP port that is free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a server accepts TCP connections at host:port now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def start_service(
    name: str,
    config_path: str,
    *,
    env: Mapping[str, str] | None = None,
    log_path: str | None = None,
    extra_args: list[str] | None = None,
    python: str | None = None,
) -> subprocess.Popen[bytes]:
    """Run `python -m services.<name> --config F` as a child in its own process group.

    stdout+stderr go to `log_path` when given (else they are inherited).
    """
    cmd = [python or sys.executable, "-m", f"services.{name}", "--config", config_path, *(extra_args or [])]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT if out else None, start_new_session=True
        )
    finally:
        if out is not None:
            out.close()


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
    """Send `sig` to the process (by PID), wait up to `timeout`, SIGKILL if it is still there; return its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
