"""`trinity run` refuses a port another server already listens on, instead of health-checking the
other server as its own child (seen: a second run "started" on the first run's buffer, which then
exited under it)."""

from __future__ import annotations

import pathlib
import socket
import subprocess

from tests.conftest import TRINITY


def test_a_port_with_a_server_already_listening_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = subprocess.run(
            [
                str(TRINITY),
                "run",
                "--set",
                f"checkpoint_root_dir={tmp_path}",
                "--set",
                f"services.buffer.port={port}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-2000:]
    assert f"127.0.0.1:{port} already has a server listening" in out
    assert "services.buffer.port" in out
    assert not list(tmp_path.rglob("*.sqlite")), "no buffer may have started"
